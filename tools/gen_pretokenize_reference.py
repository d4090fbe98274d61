#!/usr/bin/env python3
"""Writes tests/tokenizer/data/pretokenize_reference.inc: the expected pieces of
every pre-tokenizer on every test text, computed by Python's third-party `regex`
module (pip install regex) running the pre-tokenizers' regex strings.

    python3 tools/gen_pretokenize_reference.py [--fixtures ../shared/fixtures]

Texts: the 46 cases of llamacpp-vocab/ggml-vocab-gpt-2.gguf.inp (split on
"\\n__ggml_vocab_test__\\n" as llama.cpp does) and the edge cases below.
Semantics, as HF tokenizers' Split(behavior="Isolated") and llama.cpp's
unicode_regex_split: the regexes run in sequence; each runs over every piece
of the previous one (the piece is the whole subject) and splits it into its
matches and the gaps between them, keeping both.

The regexes are the models' own (tokenizer.json), which llama.cpp's
src/llama-vocab.cpp also lists per `tokenizer.ggml.pre` value; for Llama 3 and
Qwen2 we keep the original `(?i:'s|...)` rather than llama.cpp's `'[sS]|...`.

The C++ side gets its Unicode data from unicodedata (tools/gen_unicode_tables.py)
while `regex` carries its own, usually newer, tables; so this script checks that
both agree on every character of the texts, and the texts avoid characters
added in recent Unicode versions.
"""
import argparse
import pathlib
import sys
import unicodedata

import regex

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_unicode_tables import DEEPSEEK_CJK, DEEPSEEK_LLM_LETTERS, DEEPSEEK_LLM_PUNCT  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "tokenizer" / "data" / "pretokenize_reference.inc"

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CJK = "[" + DEEPSEEK_CJK + "]+"

PRE = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    "gpt-2": [GPT2],
    "mpt": [GPT2],
    "starcoder": [r"\p{N}", GPT2],
    "refact": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
    "deepseek-llm": ["[\r\n]", r"\s?[" + DEEPSEEK_LLM_LETTERS + "]+", r"\s?[" + DEEPSEEK_LLM_PUNCT + "]+",
                     r"\s+$", CJK, r"\p{N}+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
    "llama-bpe": [LLAMA3],
    "qwen2": [QWEN2],
    "deepseek-r1-qwen": [QWEN2],
}

EDGE = [
    # contractions, case, apostrophes
    "I'm you're he'll we've she'd it's don't DON'T IT'S We'Re",
    "it'\u017f It'\u017fx", "''s", "'", "'re'", "x'LL y'lL", "rock'n'roll", " 's", "\u2019s it\u2019s",
    # whitespace runs
    "a  b   c", "  leading", "trailing  ", "\t\tTabs\t", "line1\nline2\r\nline3\n\n\nend", " \n \n", "\r\n\r\n",
    "\n", " ", "   ", "\t", "\r", "\u00a0\u00a0x", "a\u3000b\u3000\u3000c", "x\u2028y\u0085z\u2029", "\u000b\u000c",
    "\x1c\x1d\x1e\x1f", "word \n\n  next", "a \t\n b", "x \r\n\t y", "  \n  ", "a\n", "\n\na", "end   ",
    # digits
    "1", "12", "123", "1234", "1234567890", "3.14159", "1,000,000", " 42 ", "\u0663\u0664\u0665\u0666",
    "\u2460\u2461\u2462\u2463", "\u216b", "x\u00b2\u00b3", "\uff11\uff12\uff13\uff14", "abc123def4567", "12 345 6789",
    "v1.2.3-rc4", "0x1F 0b1010",
    # CJK, Hangul, kana
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u4e2d\u6587English\u6df7\u5408123",
    # Arabic, Hebrew, Indic, Thai (marks: Mn/Mc are not \p{L})
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    # combining marks
    "e\u0301te\u0301", "a\u0308\u0308 b", "\u0301x", " \u0301", "\u20dd1",
    # emoji
    "\U0001f600 \U0001f999 \U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f3f3\ufe0f\u200d\U0001f308",
    "a\U0001f600b", "\U0001f44d\U0001f3fd", " \U0001f600\U0001f600",
    # punctuation and symbols
    "Hello, world! How are you?", "...!!!???", "(a+b)*c=d", "$100 ~ 200^2 | x`y`", "<html><body>Hi</body></html>",
    "foo_bar-baz", "\u00abquotes\u00bb \u201csmart\u201d \u2018single\u2019", "\u00bfQu\u00e9? \u00a1S\u00ed!",
    "x = [1, 2, 3]  # comment", "def f(x):\n    return x ** 2\n", "\uff0d\uff0b\uff01", "\u3002\u3001",
    "\u00a9 \u00ae \u2122 \u20ac \u00a3 \u00a5", "\u2211\u222b\u221a", " !x", "! x", "  !!", "\t!", "?\n\n", ".\r\n",
    "a.\n\nb", "a\u200bb", "a\u00adb", "@user #tag", "https://example.com/a?b=c&d=e", "C++ && C#",
    # Greek, Cyrillic, letterlike
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "\u2102\u210d \u212a \u2160", "\u01c5\u01c8 \u02b0\u02b2",
    # longer mixed
    "The year 2024: \u4e2d\u6587, \u0627\u0644\u0639\u0631\u0628\u064a\u0629, emoji \U0001f680!\n\n  Done.",
]


def split(pieces, rx):
    out = []
    for p in pieces:
        pos = 0
        for m in rx.finditer(p):
            if m.start() > pos:
                out.append(p[pos:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            pos = max(pos, m.end())
        if pos < len(p):
            out.append(p[pos:])
    return out


def check_tables_agree(texts):
    """regex's \\p{L}, \\p{N}, \\p{P}, \\s must agree with unicodedata on every character used."""
    probes = {"L": regex.compile(r"\p{L}"), "N": regex.compile(r"\p{N}"), "P": regex.compile(r"\p{P}")}
    for ch in sorted(set("".join(texts))):
        cat = unicodedata.category(ch)
        for k, rx in probes.items():
            if bool(rx.fullmatch(ch)) != cat.startswith(k):
                sys.exit(f"U+{ord(ch):04X}: regex and unicodedata {unicodedata.unidata_version} disagree on \\p{{{k}}}")


def c_string(s):
    out = []
    for b in s.encode("utf-8"):
        if b == 0x22 or b == 0x5C:
            out.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F and b != 0x3F:  # '?' escaped: no trigraphs
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default=str(ROOT.parent / "shared" / "fixtures"))
    args = ap.parse_args()
    inp = (pathlib.Path(args.fixtures) / "llamacpp-vocab" / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8")
    cases = inp.split("\n__ggml_vocab_test__\n")[:-1]
    assert len(cases) == 46, len(cases)
    texts = cases + EDGE
    check_tables_agree(texts)

    lines = [
        "// tests/tokenizer/data/pretokenize_reference.inc: GENERATED by tools/gen_pretokenize_reference.py",
        f"// (Python {sys.version.split()[0]}, regex {regex.__version__}); do not edit, rerun the script.",
        "// Texts 0..45: llamacpp-vocab/ggml-vocab-gpt-2.gguf.inp; the rest: the script's edge cases.",
        "// pretok_expected: for each pre-tokenizer name and text, the byte lengths of the expected pieces.",
        "",
        "inline constexpr std::string_view pretok_texts[] = {",
    ]
    for t in texts:
        lines.append(f"    {{{c_string(t)}, {len(t.encode('utf-8'))}}},")
    lines += ["};", "", "inline constexpr pretok_case pretok_expected[] = {"]
    for name, res in PRE.items():
        rxs = [regex.compile(r) for r in res]
        for i, t in enumerate(texts):
            pieces = [t] if t else []
            for rx in rxs:
                pieces = split(pieces, rx)
            assert "".join(pieces) == t
            lens = " ".join(str(len(p.encode("utf-8"))) for p in pieces)
            lines.append(f'    {{"{name}", {i}, "{lens}"}},')
    lines += ["};", ""]
    OUT.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {OUT}: {len(texts)} texts x {len(PRE)} pre-tokenizers")


if __name__ == "__main__":
    main()
