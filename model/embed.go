package model

import "github.com/strata-llm/strata/model/ggml"

// dequantizeRow writes row i of w to dst as float32.
func dequantizeRow(w *Weight, i int, dst []float32) {
	if err := ggml.DequantizeRow(w.Type, w.Row(i), dst); err != nil {
		// Load checked the type and shape, so this is a broken invariant.
		panic("model: " + w.Name + ": " + err.Error())
	}
}
