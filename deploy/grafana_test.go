package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestGrafanaDashboard: grafana/strata.json is a dashboard whose panels
// each query something, and every strata_ metric it names is one the
// coordinator or a shard exports (a renamed metric fails here, not on an
// operator's empty panel).
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile("grafana/strata.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("grafana/strata.json: %v", err)
	}
	if d.UID == "" || len(d.Panels) < 8 {
		t.Fatalf("dashboard uid %q with %d panels", d.UID, len(d.Panels))
	}
	var src strings.Builder
	for _, f := range []string{"../coordinator/metrics.go", "../shard/metrics.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	name := regexp.MustCompile(`strata_[a-z_]+`)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(m, suf); ok && strings.Contains(src.String(), `"`+b+`"`) {
						base = b
					}
				}
				if !strings.Contains(src.String(), `"`+base+`"`) {
					t.Errorf("panel %q queries %s, which no metrics.go exports", p.Title, m)
				}
			}
		}
	}
}
