package transport

import (
	"strings"

	"github.com/strata-llm/strata/transport/pb"
)

// ReasonLabel returns r's name in lower case ("finished", "lease", ...):
// the key of pb.Counters.tombstones_applied and the value of the reason
// label on strata_tombstones_total.
func ReasonLabel(r pb.Tombstone_Reason) string {
	return strings.ToLower(r.String())
}
