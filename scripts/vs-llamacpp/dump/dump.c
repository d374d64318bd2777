// dump: runs one prompt through libllama (as llama-server does: one batch,
// logits of the last token only) and writes every graph tensor the
// scheduler computes, as float32, for comparison with strata's own
// intermediate tensors. See README.md. Not part of the Go build.
//
// usage: dump MODEL OUTDIR FA(on|off) THREADS TOKEN...
// OUTDIR/index.txt lists "seq name op ne0 ne1 ne2 ne3" per file
// OUTDIR/SEQ.f32 (ne0 fastest, the tensor's logical order).
#include <llama.h>
#include <ggml.h>
#include <ggml-backend.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *outdir;
static FILE *idx;
static int seq;

static float elem(const struct ggml_tensor *t, const char *p) {
	switch (t->type) {
	case GGML_TYPE_F32: return *(const float *)p;
	case GGML_TYPE_F16: return ggml_fp16_to_fp32(*(const ggml_fp16_t *)p);
	case GGML_TYPE_I32: return (float)*(const int32_t *)p;
	default: return 0;
	}
}

static bool cb(struct ggml_tensor *t, bool ask, void *user) {
	(void)user;
	if (ask) return true; // observe every node (each is computed alone)
	if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_I32) return true;
	size_t nbytes = ggml_nbytes(t);
	char *buf = malloc(nbytes);
	ggml_backend_tensor_get(t, buf, 0, nbytes);
	char path[4096];
	snprintf(path, sizeof path, "%s/%04d.f32", outdir, seq);
	FILE *f = fopen(path, "wb");
	for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
	for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
	for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
	for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
		float v = elem(t, buf + i0*t->nb[0] + i1*t->nb[1] + i2*t->nb[2] + i3*t->nb[3]);
		fwrite(&v, 4, 1, f);
	}
	fclose(f);
	free(buf);
	fprintf(idx, "%04d %s %s %lld %lld %lld %lld\n", seq, t->name, ggml_op_desc(t),
		(long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
	seq++;
	return true;
}

int main(int argc, char **argv) {
	if (argc < 6) {
		fprintf(stderr, "usage: dump MODEL OUTDIR FA(on|off) THREADS TOKEN...\n");
		return 2;
	}
	outdir = argv[2];
	char path[4096];
	snprintf(path, sizeof path, "%s/index.txt", outdir);
	idx = fopen(path, "w");
	if (!idx) { perror(path); return 1; }
	llama_backend_init();
	struct llama_model_params mp = llama_model_default_params();
	struct llama_model *model = llama_model_load_from_file(argv[1], mp);
	if (!model) return 1;
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = 2048;
	cp.n_threads = cp.n_threads_batch = atoi(argv[4]);
	cp.flash_attn_type = strcmp(argv[3], "on") == 0 ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
	cp.cb_eval = cb;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	if (!ctx) return 1;
	int n = argc - 5;
	llama_token *toks = malloc(n * sizeof *toks);
	for (int i = 0; i < n; i++) toks[i] = atoi(argv[5 + i]);
	if (llama_decode(ctx, llama_batch_get_one(toks, n))) return 1;
	const float *logits = llama_get_logits_ith(ctx, -1);
	int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
	snprintf(path, sizeof path, "%s/logits.f32", outdir);
	FILE *f = fopen(path, "wb");
	fwrite(logits, 4, nv, f);
	fclose(f);
	fclose(idx);
	llama_free(ctx);
	llama_model_free(model);
	return 0;
}
