#!/usr/bin/env python3
"""Write the man 3 pages of libdlock's public API from its headers.

    scripts/man3.py OUTDIR VERSION HEADER...

The header comments are the API reference; this turns them into pages:
one per function declared DLOCK_EXTERN (its /** comment */, @param lines as
a list, @return as RETURN VALUE) and per documented `typedef struct`, and
dlock(3), the overview: each header's opening comment and its functions.
Also run by tests/install/run.sh's checks (every exported function has a
page) through the build.
"""
import os
import re
import sys

DOC = re.compile(r"/\*\*(.*?)\*/", re.S)
FUNC = re.compile(r"DLOCK_EXTERN\s+([^;(]*?)\b(dlock\w+)\s*\(([^;]*?)\)\s*;", re.S)
STRUCT = re.compile(r"typedef\s+struct\s+(\w+)\s*\{.*?\}\s*(\w+)\s*;", re.S)


def comment_text(body):
    lines = [re.sub(r"^\s*\* ?", "", line) for line in body.strip("\n").split("\n")]
    return "\n".join(lines).strip()


def esc(text):
    """Text for roff: backslashes, and lines that would start a request."""
    text = text.replace("\\", "\\e")
    out = []
    for line in text.split("\n"):
        line = line.rstrip()
        if line.startswith((".", "'")):
            line = "\\&" + line
        out.append(line)
    return "\n".join(out)


def paragraphs(text):
    """Blank-line separated paragraphs; indented lines stay as they are."""
    out, block = [], []
    for line in text.split("\n") + [""]:
        if line.strip():
            block.append(line)
            continue
        if block:
            if all(b.startswith("  ") for b in block):
                out.append(".PP\n.nf\n" + esc("\n".join(b[2:] for b in block)) + "\n.fi")
            else:
                out.append(".PP\n" + esc("\n".join(b.strip() for b in block)))
            block = []
    return "\n".join(out)


def split_tags(text):
    """The free text, the @param pairs and the @return text of a comment."""
    free, params, ret, cur = [], [], [], None
    for line in text.split("\n"):
        m = re.match(r"@param\s+(\w+)\s*(.*)", line.strip())
        if m:
            params.append([m.group(1), m.group(2)])
            cur = params[-1]
            continue
        m = re.match(r"@return\s*(.*)", line.strip())
        if m:
            ret.append(m.group(1))
            cur = ret
            continue
        if cur is None or not line.strip():
            if line.strip() or cur is None:
                free.append(line)
            cur = None
        elif cur is ret:
            ret.append(line.strip())
        else:
            cur[1] += " " + line.strip()
    return "\n".join(free).strip(), params, " ".join(ret).strip()


def header_name(path, root):
    return os.path.relpath(path, root).replace(os.sep, "/")


def page(name, version, section_text):
    return (
        f'.TH {name.upper()} 3 "" "dlock {version}" "libdlock manual"\n'
        + section_text.rstrip("\n")
        + "\n"
    )


def main():
    outdir, version, headers = sys.argv[1], sys.argv[2], sys.argv[3:]
    root = os.path.commonpath([os.path.dirname(h) for h in headers])
    root = root[: root.rindex("include") + len("include")] if "include" in root else root
    os.makedirs(outdir, exist_ok=True)
    funcs, structs, overview = [], [], []
    for path in sorted(headers):
        src = open(path, encoding="utf-8").read()
        inc = header_name(path, root)
        top = re.match(r"/\*(.*?)\*/", src, re.S)
        if top:
            overview.append((inc, comment_text(top.group(1))))
        docs = [(m.end(), comment_text(m.group(1))) for m in DOC.finditer(src)]
        for m in FUNC.finditer(src):
            before = [d for end, d in docs if end <= m.start() and not src[end : m.start()].strip()]
            ret_type = " ".join(m.group(1).split())
            args = " ".join(m.group(3).split())
            funcs.append((m.group(2), inc, f"{ret_type} {m.group(2)}({args});", before[-1] if before else ""))
        for m in STRUCT.finditer(src):
            before = [d for end, d in docs if end <= m.start() and not src[end : m.start()].strip()]
            if before:
                body = m.group(0).expandtabs(8)
                structs.append((m.group(2), inc, body, before[-1]))
    by_header = {}
    for name, inc, _, _ in funcs:
        by_header.setdefault(inc, []).append(name)
    for name, inc, proto, doc in funcs:
        free, params, ret = split_tags(doc)
        text = f".SH NAME\n{name} \\- {esc(first_sentence(free, name))}\n"
        text += f".SH SYNOPSIS\n.nf\n.B #include <{inc}>\n.PP\n{esc(proto)}\n.fi\n"
        text += ".PP\nLink with \\fI\\-ldlock\\fP (pkg\\-config dlock).\n"
        if free or params:
            text += ".SH DESCRIPTION\n" + paragraphs(free) + "\n"
        for pname, ptext in params:
            text += f'.TP\n.I {pname}\n{esc(ptext.strip())}\n'
        if ret:
            text += ".SH RETURN VALUE\n" + esc(ret) + "\n"
        others = [o for o in by_header[inc] if o != name]
        refs = ["dlock (3)"] + [f"{o} (3)" for o in others]
        text += ".SH SEE ALSO\n" + ",\n".join(".BR " + r for r in refs) + "\n"
        write(outdir, name, page(name, version, text))
    for name, inc, body, doc in structs:
        text = f".SH NAME\n{name} \\- {esc(first_sentence(doc, name))}\n"
        text += f".SH SYNOPSIS\n.nf\n.B #include <{inc}>\n.PP\n{esc(body)}\n.fi\n"
        text += ".SH DESCRIPTION\n" + paragraphs(doc) + "\n"
        text += ".SH SEE ALSO\n.BR dlock (3)\n"
        write(outdir, name, page(name, version, text))
    text = ".SH NAME\ndlock \\- distributed locks for C programs (libdlock)\n"
    text += ".SH SYNOPSIS\n.nf\n.B #include <dlock/dlock.h>\n.fi\n.PP\nLink with \\fI\\-ldlock\\fP (pkg\\-config dlock).\n"
    text += ".SH DESCRIPTION\n"
    for inc, doc in overview:
        text += f'.SS "<{inc}>"\n' + paragraphs(doc) + "\n"
        if inc in by_header:
            text += ".PP\nFunctions:\n" + "\n".join(f".BR {n} (3)" for n in by_header[inc]) + "\n"
    text += ".SH SEE ALSO\n.BR dlock (1),\n.BR pkg\\-config (1)\n"
    write(outdir, "dlock", page("dlock", version, text))
    return 0


def first_sentence(text, name):
    flat = " ".join(text.split())
    m = re.match(r"(.+?[.:;])(\s|$)", flat)
    s = (m.group(1) if m else flat).rstrip(".:;")
    return s or name


def write(outdir, name, text):
    with open(os.path.join(outdir, name + ".3"), "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
