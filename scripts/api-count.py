#!/usr/bin/env python3
"""Count the fastudp library's public items from its API snapshot.

The rule is docs/DEVELOPMENT.md's "The public-API check": every line of
crates/fastudp-io/public-api.txt (written by scripts/public-api.sh) except the
`impl` lines and the methods, associated types and constants listed under a
trait impl (`impl Trait for Type`). Functions and methods, types, fields,
enum variants, constants and modules count; impls do not.

    scripts/api-count.py            print the count
    scripts/api-count.py -v         print the counted lines, then the count
    scripts/api-count.py [-v] FILE  count another snapshot
"""
import re
import sys


def strip_generics(text):
    """`a::B<'a, T>::c` -> `a::B::c` (nested angle brackets included)."""
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def strip_ref(text):
    """`&'a T` or `&mut T` -> `T`: a trait implemented for a reference."""
    return re.sub(r"^&(?:'\w+ )?(?:mut )?", "", text)


def item_path(line):
    """The path of a `pub fn|type|const` line, generics removed, or None."""
    m = re.match(r"^pub (?:const |unsafe |async |extern \"C\" )*(fn|type|const) (.*)$", line)
    if not m:
        return None
    rest = strip_ref(m.group(2))
    if rest.startswith("("):  # a tuple type, `(&A, S)::f`: generics kept
        return rest.split(")::", 1)[0] + ")::" + rest.split(")::", 1)[-1].split("(", 1)[0]
    # The path ends at the argument list, the type annotation or `=`.
    depth, end = 0, len(rest)
    for i, ch in enumerate(rest):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0 and ch in "( =":
            end = i
            break
        elif depth == 0 and ch == ":" and not (
            rest.startswith("::", i) or rest.startswith("::", i - 1)
        ):
            end = i
            break
    return strip_generics(rest[:end])


def count(path, verbose):
    n = 0
    trait_for = None  # the type of the trait impl being listed, if any
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or (line.startswith("#") and not line.startswith("#[")):
                continue
            if re.match(r"^(unsafe )?impl\b", line):
                if " for " in line:
                    trait_for = strip_ref(strip_generics(line.rsplit(" for ", 1)[1]).strip())
                else:
                    trait_for = None
                continue
            p = item_path(line)
            if trait_for and p is not None and p.startswith(trait_for + "::"):
                continue
            n += 1
            if verbose:
                print(line)
    return n


def main():
    args = sys.argv[1:]
    verbose = bool(args) and args[0] == "-v"
    if verbose:
        args = args[1:]
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    path = args[0] if args else "crates/fastudp-io/public-api.txt"
    try:
        print(count(path, verbose))
    except OSError as e:
        print(f"api-count.py: {path}: {e.strerror}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
