"""A small renderer for the subset of Helm's Go templates that ops/helm/triage uses.

Enough to test the chart where helm is not installed: actions with `{{-`/`-}}` trimming,
comments, `if`/`else`/`end`, `range $v := X`, `define`/`include`, `$`, `.Values...`,
`.Release`, `.Chart`, `.Files.Get`, and the functions toYaml, nindent, indent, quote,
default, sha256sum, add, div. Anything else raises, so a template that outgrows the
subset fails its test instead of rendering wrongly.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.S)


@dataclass
class Node:
    kind: str  # text, action, if, range, define
    arg: str = ""
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


def _tokens(src: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    for m in ACTION.finditer(src):
        text = src[pos:m.start()]
        if m.group(1):
            text = text.rstrip()
        if out and out[-1][0] == "trim_next":
            out.pop()
            text = text.lstrip()
        out.append(("text", text))
        out.append(("action", m.group(2).strip()))
        if m.group(3):
            out.append(("trim_next", ""))
        pos = m.end()
    tail = src[pos:]
    if out and out[-1][0] == "trim_next":
        out.pop()
        tail = tail.lstrip()
    out.append(("text", tail))
    return out


def parse(src: str) -> list[Node]:
    stack: list[list[Node]] = [[]]
    opened: list[Node] = []
    for kind, value in _tokens(src):
        if kind == "text":
            stack[-1].append(Node("text", value))
            continue
        if value.startswith("/*"):
            continue
        word = value.split(None, 1)[0]
        rest = value[len(word):].strip()
        if word in ("if", "range", "define"):
            node = Node(word, rest)
            stack[-1].append(node)
            opened.append(node)
            stack.append(node.body)
        elif word == "else":
            stack.pop()
            stack.append(opened[-1].orelse)
        elif word == "end":
            stack.pop()
            opened.pop()
        else:
            stack[-1].append(Node("action", value))
    assert not opened, "unclosed block"
    return stack[0]


class Renderer:
    def __init__(self, chart: Path, values: dict[str, Any], release: str = "rel") -> None:
        self.chart = chart
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        self.root = {
            "Values": values,
            "Release": {"Name": release, "Service": "Helm", "Namespace": "default"},
            "Chart": {"Name": meta["name"], "Version": meta["version"],
                      "AppVersion": meta["appVersion"]},
        }  # fmt: skip
        self.defines: dict[str, list[Node]] = {}
        for tpl in sorted((chart / "templates").glob("*.tpl")):
            for node in parse(tpl.read_text()):
                if node.kind == "define":
                    self.defines[json.loads(node.arg)] = node.body

    def render_file(self, path: Path) -> str:
        return self._run(parse(path.read_text()), self.root, {"$": self.root})

    def _run(self, nodes: list[Node], dot: Any, env: dict[str, Any]) -> str:
        out: list[str] = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.arg)
            elif n.kind == "action":
                out.append(_str(self._pipeline(n.arg, dot, env)))
            elif n.kind == "if":
                branch = n.body if _truthy(self._pipeline(n.arg, dot, env)) else n.orelse
                out.append(self._run(branch, dot, env))
            elif n.kind == "range":
                m = re.fullmatch(r"(\$\w+)\s*:=\s*(.+)", n.arg)
                assert m, f"unsupported range {n.arg!r}"
                for item in self._pipeline(m.group(2), dot, env) or []:
                    out.append(self._run(n.body, item, {**env, m.group(1): item}))
            elif n.kind != "define":
                raise ValueError(n.kind)
        return "".join(out)

    def _pipeline(self, text: str, dot: Any, env: dict[str, Any]) -> Any:
        value: Any = None
        for i, cmd in enumerate(_split_pipes(text)):
            words = shlex.split(cmd, posix=False)
            args = [self._term(w, dot, env) for w in words[1:]]
            if i > 0:
                args.append(value)
            head = words[0]
            if head in FUNCS or head in ("include", ".Files.Get"):
                value = self._call(head, args)
            else:
                value = self._term(head, dot, env)
        return value

    def _call(self, name: str, args: list[Any]) -> Any:
        if name == ".Files.Get":
            return (self.chart / args[0]).read_text()
        if name == "include":
            return self._run(self.defines[args[0]], args[1], {"$": self.root})
        return FUNCS[name](*args)

    def _term(self, word: str, dot: Any, env: dict[str, Any]) -> Any:
        if word.startswith('"'):
            return json.loads(word)
        if re.fullmatch(r"-?\d+(\.\d+)?", word):
            return float(word) if "." in word else int(word)
        if word == ".":
            return dot
        if word.startswith("$"):
            name, _, path = word.partition(".")
            base = env[name]
        else:
            base, path = dot, word[1:]
        for part in [p for p in path.split(".") if p]:
            base = base.get(part) if isinstance(base, dict) else None
        return base


def _split_pipes(text: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "|" and not quoted:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _truthy(v: Any) -> bool:
    return bool(v) and v != 0


def _to_yaml(v: Any) -> str:
    return yaml.safe_dump(v, sort_keys=True, default_flow_style=False, width=10_000).rstrip("\n")


def _indent(n: int, s: Any) -> str:
    return "\n".join(" " * n + line if line else line for line in _str(s).split("\n"))


FUNCS: dict[str, Any] = {
    "toYaml": _to_yaml,
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "quote": lambda s: json.dumps(_str(s)),
    "default": lambda d, v: v if _truthy(v) else d,
    "sha256sum": lambda s: hashlib.sha256(_str(s).encode()).hexdigest(),
    "add": lambda a, b: a + b,
    "div": lambda a, b: a // b,
}


def render_chart(chart: Path, values: dict[str, Any]) -> dict[str, str]:
    """Every template's output, by file name (helpers excluded)."""
    r = Renderer(chart, values)
    return {p.name: r.render_file(p) for p in sorted((chart / "templates").glob("*.yaml"))}


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """The Kubernetes objects, parsed (empty documents dropped)."""
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]
