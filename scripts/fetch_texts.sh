#!/usr/bin/env bash
# Real long English texts for the model benchmarks, from Debian documentation packages.
#
# Installs (apt, only when missing) developers-reference, debian-policy and debian-reference-en,
# converts their HTML chapters to normalized plain UTF-8 prose (a small stdlib html.parser step run
# by /usr/bin/python3: code blocks, tables, navigation and tables of contents dropped) and writes
#   $FLX_CACHE/texts/bench.txt          the benchmark prompt: the Debian Developer's Reference, whole
#                                       book in reading order (~ 24K tokens with SmolLM2's tokenizer)
#   $FLX_CACHE/texts/docs/<name>.txt    one file per chapter of the Debian Policy Manual (policy-*)
#                                       and of the Debian Reference (debref-*): distinct documents,
#                                       boundaries kept, for training / held-out use; never used as
#                                       the benchmark prompt
#   $FLX_CACHE/texts/train/code-ucx.txt   C code: UCX's public UCP headers (libucx-dev, a build dependency),
#                                       comments and declarations as written; predictor training only
#   $FLX_CACHE/texts/train/manual-vim.txt a user manual in plain prose: Vim's usr_*.txt (vim-runtime),
#                                       predictor training only
#   $FLX_CACHE/texts/MANIFEST.tsv       name, role, package, version, source path(s), bytes, words, sha256
# If apt cannot install them (no network, no root), bench.txt falls back to
# /usr/share/common-licenses/GPL-3 + GPL-2 (always present, ~ 10.9K tokens) and the MANIFEST says so.
#
# Idempotent: rerunning rewrites the same bytes (the files are deterministic in the package
# versions) and says what it did. Environment: FLX_CACHE (default ~/.cache/fluxion),
# FLX_TEXTS_NO_APT=1 to never call apt.
set -euo pipefail
cache="${FLX_CACHE:-$HOME/.cache/fluxion}"
out="$cache/texts"
pkgs=(developers-reference debian-policy debian-reference-en vim-runtime libucx-dev)
mkdir -p "$out/docs" "$out/train"

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ] && [ "${FLX_TEXTS_NO_APT:-0}" != 1 ]; then
  echo "fetch_texts: installing ${missing[*]} (apt)"
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo -n"
  if ! { $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
           --no-install-recommends "${missing[@]}" > "$out/apt.log" 2>&1 ||
         { $sudo_ apt-get update -q >> "$out/apt.log" 2>&1 &&
           $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
             --no-install-recommends "${missing[@]}" >> "$out/apt.log" 2>&1; }; }; then
    echo "fetch_texts: WARNING: apt could not install ${missing[*]} (see $out/apt.log); using what is present" >&2
  fi
else
  echo "fetch_texts: packages present: ${pkgs[*]}"
fi

/usr/bin/python3 - "$out" <<'PY'
import glob, gzip, hashlib, html.parser, os, re, subprocess, sys, unicodedata

out = sys.argv[1]

def pkg_version(p):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", p], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:
        return ""

BLOCK = {"p", "div", "section", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5",
         "h6", "br", "blockquote", "article", "figure", "figcaption", "hr", "tr"}
SKIP_TAGS = {"script", "style", "head", "pre", "table", "nav", "title", "noscript", "svg"}
# Sphinx (developers-reference, policy) and DocBook (debian-reference) page furniture
SKIP_CLASSES = {"sphinxsidebar", "related", "footer", "headerlink", "highlight", "toc", "navheader",
                "navfooter", "toctree-wrapper", "contents", "topic", "list-of-tables", "footnotes",
                "literal-block-wrapper", "rst-footer-buttons", "wy-nav-side", "breadcrumbs",
                "screen", "programlisting", "literallayout", "synopsis", "cmdsynopsis"}

class Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paras, self.cur, self.stack = [], [], []   # stack: (tag, skipping)

    def skipping(self):
        return bool(self.stack) and self.stack[-1][1]

    def flush(self):
        s = re.sub(r"\s+", " ", "".join(self.cur)).strip()
        if s:
            self.paras.append(s)
        self.cur = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = set((a.get("class") or "").split())
        skip = self.skipping() or tag in SKIP_TAGS or bool(cls & SKIP_CLASSES) or \
            a.get("role") == "navigation"
        if tag in BLOCK and not self.skipping():
            self.flush()
        if tag in ("br", "hr", "img", "meta", "link", "input", "wbr"):
            return  # void elements never close
        self.stack.append((tag, skip))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):   # tolerate unclosed tags
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if tag in BLOCK and not self.skipping():
            self.flush()

    def handle_data(self, data):
        if not self.skipping():
            self.cur.append(data)

def html_to_text(path):
    p = Text()
    with open(path, encoding="utf-8", errors="replace") as f:
        p.feed(f.read())
    p.close()
    p.flush()
    paras = []
    for s in p.paras:
        s = unicodedata.normalize("NFC", s.replace("\u00b6", "").replace("\u00a0", " ")).strip()
        if not s or s in ("Note", "Warning", "Tip", "Caution", "Important"):
            continue
        paras.append(s)
    return "\n\n".join(paras) + "\n"

def sphinx_order(d):
    """Chapters in the book's reading order: as linked from index.html."""
    idx = os.path.join(d, "index.html")
    seen, order = set(), []
    if os.path.exists(idx):
        for m in re.finditer(r'href="([a-z0-9_.-]+\.html)(?:#[^"]*)?"', open(idx, encoding="utf-8").read()):
            f = m.group(1)
            if f not in seen and f not in ("index.html", "genindex.html", "search.html") and \
                    os.path.exists(os.path.join(d, f)):
                seen.add(f)
                order.append(f)
    return [os.path.join(d, f) for f in order]

manifest = []
def emit(name, role, text, package, sources):
    path = os.path.join(out, name)
    data = text.encode("utf-8")
    old = open(path, "rb").read() if os.path.exists(path) else None
    if old != data:
        with open(path + ".part", "wb") as f:
            f.write(data)
        os.replace(path + ".part", path)
    manifest.append((name, role, package, pkg_version(package) if package else "", ",".join(sources),
                     str(len(data)), str(len(text.split())), hashlib.sha256(data).hexdigest()))
    print("fetch_texts: %-40s %8d bytes %7d words  %s  (%s)" %
          (name, len(data), len(text.split()), "unchanged" if old == data else "written", package or "fallback"))

# bench.txt: the Developer's Reference, whole book
devref = sphinx_order("/usr/share/developers-reference")
devref = [f for f in devref if not f.endswith("developers-reference.html")]
if devref:
    parts = [html_to_text(f) for f in devref]
    emit("bench.txt", "benchmark prompt (whole book)", "\n".join(parts), "developers-reference", devref)
else:
    # GPL-3 alone is ~7.1K SmolLM2 tokens; GPL-2 after it brings the prompt past 8K
    lic = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2"]
    parts = []
    for f in lic:
        t = unicodedata.normalize("NFC", open(f, encoding="utf-8").read())
        parts.append("\n\n".join(re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", t) if p.strip()) + "\n")
    emit("bench.txt", "benchmark prompt (FALLBACK: developers-reference missing)", "\n".join(parts), "base-files", lic)

# docs/: one document per chapter, for training / held-out use
for pkg, d, prefix in (("debian-policy", "/usr/share/doc/debian-policy/policy.html", "policy-"),):
    for f in sphinx_order(d):
        stem = os.path.basename(f)[:-5]
        emit("docs/" + prefix + stem + ".txt", "document", html_to_text(f), pkg, [f])
for f in sorted(glob.glob("/usr/share/debian-reference/*.en.html")):
    stem = os.path.basename(f)[:-len(".en.html")]
    if stem == "index":
        continue
    emit("docs/debref-" + stem + ".txt", "document", html_to_text(f), "debian-reference-en", [f])

# train/: training texts of other kinds than documentation (code, a prose manual); never held out
def plain(paths):
    return "\n".join(unicodedata.normalize("NFC", open(f, encoding="utf-8", errors="replace").read())
                     for f in paths)
ucp = [f for f in ("/usr/include/ucp/api/ucp_def.h", "/usr/include/ucp/api/ucp.h") if os.path.exists(f)]
if ucp:
    emit("train/code-ucx.txt", "training text (C code)", plain(ucp), "libucx-dev", ucp)
vim = sorted(glob.glob("/usr/share/vim/vim*/doc/usr_[0-9]*.txt"))
if vim:
    emit("train/manual-vim.txt", "training text (prose manual)", plain(vim), "vim-runtime", vim)

# drop documents a previous run wrote that are no longer produced
keep = {m[0] for m in manifest}
for f in glob.glob(os.path.join(out, "docs", "*.txt")):
    if "docs/" + os.path.basename(f) not in keep:
        os.remove(f)
        print("fetch_texts: removed stale", f)
with open(os.path.join(out, "MANIFEST.tsv"), "w", encoding="utf-8") as f:
    f.write("name\trole\tpackage\tversion\tsources\tbytes\twords\tsha256\n")
    for m in manifest:
        f.write("\t".join(m) + "\n")
print("fetch_texts: %d texts, manifest %s" % (len(manifest), os.path.join(out, "MANIFEST.tsv")))
PY
