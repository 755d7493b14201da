#!/usr/bin/env python3
"""Checks terse's documents against the tree (ctest label docs; docs/STYLE.md 2 and 14).

    tests/docs/check_docs.py links [ROOT]          every relative link in README.md and docs/*.md resolves: the file
                                                   exists and, where a #anchor is given, the target has that heading
    tests/docs/check_docs.py citations [ROOT]      every document a source file cites by a path ending in .md exists,
                                                   and so does every section it names: "DESIGN.md section N" and
                                                   "docs/STYLE.md N" need a heading numbered N, a path followed by
                                                   a quoted heading needs a heading of that text
    tests/docs/check_docs.py readme-length [ROOT] [--max-lines N]
                                                   README.md has at most N lines (150: the README is the front door,
                                                   everything else is in docs/)
    tests/docs/check_docs.py all [ROOT]            the three above
    ... --expect FILE                              the checker's own test: exit 0 only when the checks fail and print
                                                   exactly FILE's text (tests/docs/fixture: a tree made to fail)

ROOT defaults to the repository this script is in. Each failure is printed on its own line as FILE:LINE: what is
wrong; the exit status is 1 when any check failed, 2 for bad usage.

How a citation resolves (the convention docs/STYLE.md 2 states): a path is taken from the repository root, or else
from the citing file's folder ("README.md here"). A bare lower-case name such as compare.md is not checked: in code
it is a file a tool writes (terse compare's compare.md, a study script's table.md), not a document cited. A path
wrapped over two comment lines ("results/reference/collectives/" then "// table.md") is joined before matching.
"""
import pathlib
import re
import sys

DEFAULT_ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# What is scanned for citations: source, build and config files. Markdown is checked by `links` instead.
SOURCE_SUFFIXES = {".h", ".hpp", ".cc", ".cu", ".cuh", ".c", ".py", ".cmake", ".proto", ".textproto", ".sh", ".toml",
                   ".in", ".json"}
SOURCE_NAMES = {"CMakeLists.txt", ".clang-format", "CMakePresets.json"}
# Never scanned: version control, build trees (build, build-cpu, ...: any top-level folder starting with "build"),
# virtual environments, results a run wrote outside results/reference, and this test's own fixture, whose broken
# links and citations are the point.
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules"}
SKIP_PATHS = {("tests", "docs", "fixture")}

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A cited document: a path of the usual characters ending in .md, and what may follow it naming a section.
CITATION = re.compile(r"(?<![A-Za-z0-9_./-])((?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-][A-Za-z0-9_.-]*\.md)(?![A-Za-z0-9_])")
SECTION_AFTER = re.compile(r"^,?\s+(?:section\s+(\d+)|(\d+)\b(?![.,]\d)|\(?\"([^\"\n]+)\")")
# A comment line that continues a path broken after a slash: "...collectives/" + newline + "// table.md".
WRAPPED_PATH = re.compile(r"/[ \t]*\n[ \t]*(?://+|#+|\*|\"\"\"|)[ \t]*(?=[A-Za-z0-9_.-]+\.md)")


def slug(heading):
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def headings(path):
    """The headings of a markdown file, outside code fences, in order."""
    found, fence = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            marker = stripped[:3]
            fence = None if fence == marker else (fence or marker)
            continue
        if fence:
            continue
        m = HEADING.match(line)
        if m:
            found.append(m.group(2))
    return found


def anchors(path):
    """Every anchor GitHub makes for path's headings, duplicates numbered -1, -2, ... as it does."""
    seen, result = {}, set()
    for h in headings(path):
        base = slug(h)
        n = seen.get(base, 0)
        result.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return result


def markdown_links(path):
    """(line number, target) of every link outside code fences and inline code."""
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            marker = stripped[:3]
            fence = None if fence == marker else (fence or marker)
            continue
        if fence:
            continue
        text = re.sub(r"`[^`]*`", "", line)
        for m in LINK.finditer(text):
            yield number, m.group(1)


def rel(root, path):
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def check_links(root):
    failures = []
    pages = [root / "README.md"] + sorted((root / "docs").glob("**/*.md"))
    for page in pages:
        if not page.exists():
            failures.append(f"{rel(root, page)}: missing")
            continue
        for number, target in markdown_links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: -- not this checker's business
                continue
            where = f"{rel(root, page)}:{number}"
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page.resolve()
            try:
                dest.relative_to(root.resolve())
            except ValueError:
                failures.append(f"{where}: link '{target}' leaves the repository")
                continue
            if not dest.exists():
                failures.append(f"{where}: link '{target}': {rel(root, dest)} does not exist")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix != ".md":
                    failures.append(f"{where}: link '{target}': an #anchor needs a markdown file")
                elif anchor not in anchors(dest):
                    failures.append(f"{where}: link '{target}': {rel(root, dest)} has no heading whose anchor is "
                                    f"'#{anchor}'")
    return failures, len(pages)


def source_files(root):
    root = root.resolve()
    stack = [root]
    while stack:
        folder = stack.pop()
        for entry in sorted(folder.iterdir()):
            parts = entry.relative_to(root).parts
            if entry.is_dir():
                if entry.name in SKIP_DIRS or (len(parts) == 1 and entry.name.startswith("build")):
                    continue
                if any(parts[:len(skip)] == skip for skip in SKIP_PATHS):
                    continue
                stack.append(entry)
            elif entry.suffix in SOURCE_SUFFIXES or entry.name in SOURCE_NAMES or is_script(entry, parts):
                yield entry


def is_script(path, parts):
    """An executable without a suffix under scripts/ (scripts/run, scripts/test, ...)."""
    return parts[0] == "scripts" and path.suffix == "" and path.is_file()


def numbered_heading(doc, number):
    return any(re.match(rf"^{number}\.(\s|$)", h) for h in headings(doc))


def named_heading(doc, name):
    wanted = " ".join(name.split()).lower()
    return any(" ".join(h.replace("`", "").split()).lower() == wanted for h in headings(doc))


def check_citations(root):
    failures, count = [], 0
    root = root.resolve()
    for path in source_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        joined = WRAPPED_PATH.sub("/", text)
        for m in CITATION.finditer(joined):
            name = m.group(1)
            if "/" not in name and not name[0].isupper():
                continue  # a file some code writes (compare.md), not a cited document
            count += 1
            line = text.count("\n", 0, text_offset(text, m.start())) + 1
            where = f"{rel(root, path)}:{line}"
            candidates = [root / name, path.parent / name]
            doc = next((c for c in candidates if c.is_file()), None)
            if doc is None:
                failures.append(f"{where}: cites {name}, which is neither {rel(root, root / name)} nor "
                                f"{rel(root, path.parent / name)}")
                continue
            after = SECTION_AFTER.match(joined[m.end():m.end() + 200])
            if not after:
                continue
            section, bare_number, heading = after.groups()
            number = section or bare_number
            if number and not numbered_heading(doc, number):
                failures.append(f"{where}: cites {name} section {number}, but {rel(root, doc)} has no heading "
                                f"'{number}. ...'")
            if heading and not named_heading(doc, heading):
                failures.append(f"{where}: cites {name} \"{heading}\", but {rel(root, doc)} has no such heading")
    return failures, count


def text_offset(text, joined_offset):
    """The offset in text of joined_offset, an offset in text with its wrapped paths joined (each join keeps its
    slash and drops what followed it up to the next line's path)."""
    removed = 0
    for m in WRAPPED_PATH.finditer(text):
        # After the join this match occupies one character ("/") at m.start() - removed.
        if m.start() - removed >= joined_offset:
            break
        removed += (m.end() - m.start()) - 1
    return joined_offset + removed


def check_readme_length(root, max_lines):
    readme = root / "README.md"
    if not readme.exists():
        return [f"{rel(root, readme)}: missing"]
    lines = len(readme.read_text(encoding="utf-8").splitlines())
    if lines > max_lines:
        return [f"README.md: {lines} lines, more than {max_lines}: the README is the front door; move the detail to "
                f"docs/ and link it"]
    return []


def main(argv):
    args = list(argv)
    max_lines = 150
    expect = None
    if "--expect" in args:
        i = args.index("--expect")
        if i + 1 >= len(args):
            print("check_docs.py: --expect needs a file", file=sys.stderr)
            return 2
        expect = pathlib.Path(args[i + 1])
        del args[i:i + 2]
    if "--max-lines" in args:
        i = args.index("--max-lines")
        try:
            max_lines = int(args[i + 1])
        except (IndexError, ValueError):
            print("check_docs.py: --max-lines needs a whole number", file=sys.stderr)
            return 2
        del args[i:i + 2]
    if not args or args[0] not in ("links", "citations", "readme-length", "all") or len(args) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    what = args[0]
    root = pathlib.Path(args[1]) if len(args) > 1 else DEFAULT_ROOT
    if not root.is_dir():
        print(f"check_docs.py: {root} is not a folder", file=sys.stderr)
        return 2
    failures, report = [], []
    if what in ("links", "all"):
        found, pages = check_links(root)
        failures += found
        report.append(f"links: {pages} pages checked, {len(found)} broken")
    if what in ("citations", "all"):
        found, count = check_citations(root)
        failures += found
        report.append(f"citations: {count} checked, {len(found)} broken")
    if what in ("readme-length", "all"):
        found = check_readme_length(root, max_lines)
        failures += found
        report.append(f"readme-length: at most {max_lines} lines, {'too long' if found else 'ok'}")
    output = "\n".join(report + failures) + "\n"
    print(output, end="")
    if expect is None:
        return 1 if failures else 0
    wanted = expect.read_text(encoding="utf-8")
    if failures and output == wanted:
        print(f"check_docs.py: the output is {expect}'s, as it must be")
        return 0
    print(f"check_docs.py: the output differs from {expect}; wanted:\n{wanted}", end="")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
