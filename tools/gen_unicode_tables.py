#!/usr/bin/env python3
"""Generates include/kestrel/tokenizer/unicode_tables.hpp from Python's unicodedata.

    python3 tools/gen_unicode_tables.py            # writes the header
    python3 tools/gen_unicode_tables.py --check    # exits 1 if the header is stale

The Unicode version is the running Python's (unicodedata.unidata_version) and is
written into the header; Python 3.13 gives Unicode 15.1.0. Tables:

  * general_category runs: every code point 0..0x10FFFF belongs to exactly one
    run of equal general category; the header stores each run's first code
    point and its category (a run ends where the next begins), searched by
    binary search. Unassigned code points are Cn.
  * whitespace ranges: the White_Space property (PropList.txt), which is what
    `\\s` means in the `regex` module, Oniguruma and PCRE2 with UCP, the engines
    whose behaviour HF tokenizers and llama.cpp's pre-tokenizer regexes follow.
    unicodedata has no White_Space table, so it is spelled out below; it has
    not changed since Unicode 6.1 (U+180E left it then).
  * the explicit character classes written out in the deepseek-llm
    pre-tokenizer regexes (llama.cpp src/llama-vocab.cpp), parsed from the
    regex text below so that the C++ tables cannot drift from it.
"""
import argparse
import pathlib
import sys
import unicodedata

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "include" / "kestrel" / "tokenizer" / "unicode_tables.hpp"

# Order = the C++ enum general_category.
CATEGORIES = ["Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
              "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So",
              "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"]

# White_Space=Yes (PropList.txt, Unicode 6.1 .. 16.0).
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]

# The deepseek-llm regexes' bracket expressions (without the brackets and `+`).
# The letter class is Unicode's cased letters (Lu|Ll|Lt) of an older version;
# six of its characters have singleton canonical decompositions (U+1F7D,
# U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) and are escaped so that no editor or
# tool can NFC-normalize them into other characters (which breaks the ranges).
DEEPSEEK_LLM_LETTERS = (
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-"
    "ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-"
    "ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃")
DEEPSEEK_LLM_PUNCT = "!-/:-~！-／：-～‘-‟　-。"
# [一-龥ࠀ-一가-퟿] of deepseek-llm and deepseek-coder.
DEEPSEEK_CJK = "一-龥ࠀ-一가-퟿"


def parse_bracket(body):
    """Ranges of a bracket expression made of literal characters and a-b ranges."""
    out, i = [], 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            out.append((ord(body[i]), ord(body[i + 2])))
            i += 3
        else:
            out.append((ord(body[i]), ord(body[i])))
            i += 1
    out.sort()
    merged = []
    for lo, hi in out:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def category_runs():
    runs, prev = [], None
    for cp in range(0x110000):
        c = unicodedata.category(chr(cp))
        if c != prev:
            runs.append((cp, CATEGORIES.index(c)))
            prev = c
    return runs


def ranges_array(name, ranges, doc):
    lines = [f"/// {doc}", f"inline constexpr code_point_range {name}[] = {{"]
    row = []
    for lo, hi in ranges:
        row.append(f"{{0x{lo:X}, 0x{hi:X}}}")
        if len(row) == 6:
            lines.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        lines.append("    " + ", ".join(row) + ",")
    lines.append("};")
    return "\n".join(lines)


def render():
    runs = category_runs()
    firsts, cats = [], []
    for cp, c in runs:
        firsts.append(f"0x{cp:X}")
        cats.append(str(c))

    ws = ranges_array("white_space", WHITE_SPACE, "White_Space=Yes: the regex engines' \\s.")
    letters = ranges_array("deepseek_llm_letters", parse_bracket(DEEPSEEK_LLM_LETTERS),
                           "The letter class spelled out in llama.cpp's deepseek-llm regex (not \\p{L}: a subset).")
    punct = ranges_array("deepseek_llm_punct", parse_bracket(DEEPSEEK_LLM_PUNCT),
                         "[!-/:-~！-／：-～‘-‟　-。] of the deepseek-llm regex.")
    cjk = ranges_array("deepseek_cjk", parse_bracket(DEEPSEEK_CJK),
                       "[一-龥ࠀ-一가-퟿] of the deepseek-llm and deepseek-coder regexes.")

    def wrap(items, per):
        return "\n".join("    " + ", ".join(items[i:i + per]) + "," for i in range(0, len(items), per))

    return f"""// kestrel/tokenizer/unicode_tables.hpp: GENERATED by tools/gen_unicode_tables.py
// from Python {sys.version.split()[0]}'s unicodedata, Unicode {unicodedata.unidata_version}. Do not edit; rerun the script.
//
// {len(runs)} runs of equal general category cover U+0000..U+10FFFF; run i spans
// category_run_first[i] .. category_run_first[i + 1] - 1 and has category
// category_run_value[i] (an index into kestrel::unicode::general_category).
#pragma once

#include <cstdint>

namespace kestrel::unicode::tables {{

inline constexpr const char* unicode_version = "{unicode_version()}";

struct code_point_range {{
  char32_t first, last;  // inclusive
}};

inline constexpr std::uint32_t category_run_count = {len(runs)};

inline constexpr char32_t category_run_first[] = {{
{wrap(firsts, 10)}
}};

inline constexpr std::uint8_t category_run_value[] = {{
{wrap(cats, 24)}
}};

{ws}

{letters}

{punct}

{cjk}

}}  // namespace kestrel::unicode::tables
"""


def unicode_version():
    return unicodedata.unidata_version


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = render()
    if args.check:
        ok = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print("up to date" if ok else f"{OUT} is stale (or made by another Python/Unicode version)")
        return 0 if ok else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} (Unicode {unicodedata.unidata_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
