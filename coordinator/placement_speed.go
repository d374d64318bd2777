package coordinator

import (
	"time"

	"github.com/strata-llm/strata/transport/pb"
)

// SpeedFromWire converts a shard's calibration for the model sha, or
// returns nil when it has none, measured another model or layers the
// model does not have.
func SpeedFromWire(c *pb.Calibration, sha string, layers int) *Speed {
	if c == nil || c.GetModelSha256() != sha || int(c.GetLayers()) > layers || c.GetLayers() == 0 {
		return nil
	}
	return &Speed{Layers: int(c.GetLayers()), Decode1: time.Duration(c.GetDecode1Ns()), Decode8: time.Duration(c.GetDecode8Ns()),
		Prefill: time.Duration(c.GetPrefillNs()), PrefillTokens: int(c.GetPrefillTokens())}
}
