#!/usr/bin/env python3
"""gen.py writes the golden renderings that chat_test.go compares against.

It renders every template named in cases.json (the package's own builtin/*.jinja
for names starting "builtin-", else ../../../../shared/chat-templates/NAME.jinja or
the directory given as the first argument) for every conversation there with Python's
Jinja2, set up the way HuggingFace transformers' apply_chat_template does:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension, a tojson that does not escape non-ASCII, raise_exception
and strftime_now (fixed to cases.json's "now" so the output is deterministic).
Variables: messages, add_generation_prompt, bos_token, eos_token, tools=None.

Output: golden/<template>.<conversation>.golden holds the rendered text; when the
template raises, golden/<template>.<conversation>.error holds the message instead.

Run from this directory: python3 gen.py   (Debian: apt-get install python3-jinja2)
"""

import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext  # noqa: F401
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent
TEMPLATES = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[3] / "shared" / "chat-templates"
OUT = HERE / "golden"


def main():
    cases = json.loads((HERE / "cases.json").read_text(encoding="utf-8"))
    now = datetime.fromisoformat(cases["now"].replace("Z", "+00:00"))

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    OUT.mkdir(exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    for name, tok in sorted(cases["templates"].items()):
        if name.startswith("builtin-"):
            path = HERE.parent / "builtin" / (name[len("builtin-"):] + ".jinja")
        else:
            path = TEMPLATES / (name + ".jinja")
        src = path.read_text(encoding="utf-8")
        tmpl = env.from_string(src)
        for conv, c in sorted(cases["conversations"].items()):
            base = OUT / f"{name}.{conv}"
            try:
                text = tmpl.render(messages=c["messages"],
                                   add_generation_prompt=c["add_generation_prompt"],
                                   bos_token=tok["bos"], eos_token=tok["eos"], tools=None)
            except TemplateError as e:
                base.with_suffix(base.suffix + ".error").write_text(str(e), encoding="utf-8")
                continue
            base.with_suffix(base.suffix + ".golden").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
