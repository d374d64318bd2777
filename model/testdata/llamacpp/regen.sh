#!/usr/bin/env bash
# Regenerates outputs.json: llama.cpp's greedy outputs for the stories260K test models.
#
# usage: regen.sh LLAMA_CPP_DIR [MODELS_DIR] [OUT_JSON]
#   LLAMA_CPP_DIR  a llama.cpp checkout with build/bin/llama-server built (see README.md)
#   MODELS_DIR     default: ../shared/models relative to the repository root (the stories260K*.gguf files)
#   OUT_JSON       default: outputs.json next to this script
#
# It starts llama-server on 127.0.0.1 once per model (2048 context, otherwise default settings),
# asks POST /tokenize for the prompt tokens and POST /completion for 64 greedy tokens, stops the
# server, and writes one JSON record per (model, prompt, settings). Needs python3 (stdlib only).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
llama="${1:?usage: regen.sh LLAMA_CPP_DIR [MODELS_DIR] [OUT_JSON]}"
llama="$(cd "$llama" && pwd)"
models="${2:-$here/../../../../shared/models}"
models="$(cd "$models" && pwd)"
out="${3:-$here/outputs.json}"
server="$llama/build/bin/llama-server"
[ -x "$server" ] || { echo "no $server: build llama-server first" >&2; exit 1; }

commit="$(git -C "$llama" rev-parse HEAD 2>/dev/null || echo unknown)"
cmake_flags="$(grep -E '^(GGML_NATIVE|CMAKE_BUILD_TYPE|LLAMA_CURL|LLAMA_OPENSSL|LLAMA_BUILD_UI|LLAMA_USE_PREBUILT_UI|GGML_CPU|GGML_OPENMP|LLAMA_BUILD_TESTS):' "$llama/build/CMakeCache.txt" 2>/dev/null | tr '\n' ' ' || true)"

exec python3 - "$server" "$models" "$out" "$commit" "$cmake_flags" <<'PY'
import json, os, re, socket, subprocess, sys, tempfile, time, urllib.request

server, models, out, commit, cmake_flags = sys.argv[1:6]

MODELS = ["stories260K.gguf", "stories260K-F16.gguf", "stories260K-BF16.gguf",
          "stories260K-Q8_0.gguf", "stories260K-Q4_0.gguf"]
PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The little dog",
           "One day, a big bear", "Sara had a red ball. She"]
N_PREDICT = 64
N_CTX = 2048

# (model, prompts, extra server args): default runs for every model, plus two variants for F32.
RUNS = [(m, PROMPTS, []) for m in MODELS] + [
    ("stories260K.gguf", PROMPTS[:1], ["--threads", "1"]),
    ("stories260K.gguf", PROMPTS[:1], ["-fa", "off"]),
]

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)

def run_server(model, extra):
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    args = [server, "-m", os.path.join(models, model), "-c", str(N_CTX),
            "--host", "127.0.0.1", "--port", str(port), "-lv", "4"] + extra
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while True:
        if p.poll() is not None:
            raise SystemExit(f"llama-server exited early, see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if time.time() > deadline:
            p.terminate(); raise SystemExit(f"llama-server did not become healthy, see {log.name}")
        time.sleep(0.2)
    return p, port, log

def settings_from_log(text):
    thr = re.findall(r"system_info: n_threads = (\d+)", text)
    fa = "on" if "Flash Attention enabled" in text else ("off" if re.search(r"flash_attn\s+= disabled", text) or "Flash Attention not supported" in text else "unknown")
    fa_req = re.findall(r"flash_attn\s+= (\w+)", text)
    kv = re.findall(r"K \((\w+)\): .*V \((\w+)\)", text)
    return (int(thr[-1]) if thr else None, fa, fa_req[-1] if fa_req else None,
            (kv[-1][0] if kv else None), (kv[-1][1] if kv else None))

records = []
system_info = None
for model, prompts, extra in RUNS:
    p, port, log = run_server(model, extra)
    try:
        recs = []
        for prompt in prompts:
            tok = post(port, "/tokenize", {"content": prompt, "add_special": True, "parse_special": False})
            res = post(port, "/completion", {
                "prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "top_k": 1,
                "samplers": ["top_k"], "repeat_penalty": 1.0, "return_tokens": True,
                "cache_prompt": False, "seed": 0,
            })
            toks = res["tokens"]
            pieces = [post(port, "/detokenize", {"tokens": [t]})["content"] for t in toks]
            recs.append({
                "model": model, "prompt": prompt,
                "prompt_tokens": tok["tokens"], "tokens": toks, "text": res["content"],
                "token_pieces": pieces, "stop_type": res.get("stop_type"),
                "n_tokens": len(toks), "server_args": extra,
                "tokens_evaluated": res.get("tokens_evaluated"),
            })
    finally:
        p.terminate()
        try: p.wait(timeout=30)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
    log.seek(0); text = log.read(); log.close(); os.unlink(log.name)
    threads, fa, fa_req, kv_k, kv_v = settings_from_log(text)
    si = re.findall(r"system_info: (.*)", text)
    if si and not extra: system_info = si[-1].strip()
    for r in recs:
        r.update({"flash_attn": fa, "flash_attn_requested": fa_req, "threads": threads,
                  "kv_type": kv_k if kv_k == kv_v else f"K={kv_k},V={kv_v}"})
        records.append(r)
        print(f"{model:24s} {' '.join(extra):12s} fa={fa} threads={threads} kv={r['kv_type']} "
              f"stop={r['stop_type']} n={r['n_tokens']} {r['prompt']!r}: {r['text'][:60]!r}", file=sys.stderr)

doc = {
    "llama_cpp_commit": commit,
    "llama_cpp_build": "cmake -B build " + cmake_flags.strip(),
    "server": "llama-server -m MODEL -c 2048 --host 127.0.0.1 -lv 4 (+ server_args; -lv 4 only makes it log its settings); "
              "POST /tokenize {content, add_special:true, parse_special:false}; "
              "POST /completion {prompt, n_predict:64, temperature:0, top_k:1, samplers:[top_k], "
              "repeat_penalty:1.0, return_tokens:true, cache_prompt:false}",
    "n_predict": N_PREDICT, "n_ctx": N_CTX,
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown"),
    "system_info": system_info,
    "results": records,
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(f"wrote {len(records)} records to {out}", file=sys.stderr)
PY
