package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-llm/strata/model"
	"github.com/strata-llm/strata/model/ggml"
	"github.com/strata-llm/strata/model/gguf"
	"github.com/strata-llm/strata/transport"
	"github.com/strata-llm/strata/transport/pb"
)

func TestClusterWeightsAndShape(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.gguf")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.WriteRandom(fh, model.DemoSpec()); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	sha, err := FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	shape, err := ShapeFromModel(f, m, sha, ggml.F16, 16, 512)
	if err != nil {
		t.Fatal(err)
	}
	var layers int64
	for _, b := range shape.LayerBytes {
		if b <= 0 {
			t.Fatalf("layer bytes %v", shape.LayerBytes)
		}
		layers += b
	}
	if shape.EmbedBytes <= 0 || shape.HeadBytes <= 0 || shape.KVBytesPerBlockLayer != int64(2*16*m.HeadsKV*m.HeadDim*2) {
		t.Fatalf("shape = %+v", shape)
	}

	c := startCluster(t, t.TempDir(), 1, func(cfg *ClusterConfig) { cfg.Shape, cfg.ModelPath = shape, path })
	cc, err := transport.Dial(c.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := pb.NewCoordinatorClient(cc).Weights(ctx, &pb.WeightsRequest{ModelSha256: sha, FirstLayer: 0, EndLayer: 1, Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	var header []byte
	for {
		ch, err := ws.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if header == nil {
			header = ch.GetGgufHeader()
		}
		got[ch.GetTensor()] = append(got[ch.GetTensor()], ch.GetData()...)
		if s := ch.GetSha256(); s != "" {
			sum := sha256.Sum256(got[ch.GetTensor()])
			if hex.EncodeToString(sum[:]) != s {
				t.Fatalf("tensor %s: checksum mismatch", ch.GetTensor())
			}
		}
	}
	if uint64(len(header)) != f.DataOffset {
		t.Fatalf("header %d bytes, data offset %d", len(header), f.DataOffset)
	}
	for _, tt := range f.Tensors {
		want := strings.HasPrefix(tt.Name, "blk.0.") || strings.HasPrefix(tt.Name, "token_embd")
		if _, ok := got[tt.Name]; ok != want {
			t.Errorf("tensor %s sent %v, want %v", tt.Name, ok, want)
		}
		if want && string(got[tt.Name]) != string(tt.Data) {
			t.Errorf("tensor %s: bytes differ", tt.Name)
		}
	}
	other, err := pb.NewCoordinatorClient(cc).Weights(ctx, &pb.WeightsRequest{ModelSha256: "other", EndLayer: 1})
	if err == nil {
		_, err = other.Recv()
	}
	if err == nil {
		t.Fatal("weights of another model were served")
	}
}
