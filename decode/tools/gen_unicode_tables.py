#!/usr/bin/python3
"""Generates decode/src/unicode_tables.c: the code point classes the tokenizer's pre-tokenizers
need (\\p{L}, \\p{N}, \\s as Oniguruma defines them for Unicode, which is what Hugging Face
tokenizers uses), as sorted inclusive ranges; and the data of NFC normalization (Qwen2's
normalizer): canonical combining classes, full canonical decompositions, primary composites.
Hangul syllables are left out of the last two: the C code composes them arithmetically.

The NFC data is cut to the characters assigned by Unicode 9.0: HF tokenizers normalizes with the
crate unicode-normalization-alignments 0.1.12, whose tables are Unicode 9.0, so a later
combining mark (U+07FD, U+10D26, ...) is class 0 there and must be here too, or the ids differ.
Character ages come from the Unicode data files (Debian package unicode-data).

Run with Debian's interpreter so the Unicode version is the system one:
    /usr/bin/python3 decode/tools/gen_unicode_tables.py > decode/src/unicode_tables.c
"""
import sys
import unicodedata


def ranges(pred):
    out, start = [], None
    for cp in range(0x110000):
        if pred(cp):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def cat(cp):
    return unicodedata.category(chr(cp))


# Oniguruma's Unicode \s: 0009-000D, 0085, 2028, 2029 and the space separators (Zs).
def is_space(cp):
    return 0x09 <= cp <= 0x0D or cp in (0x85, 0x2028, 0x2029) or cat(cp) == 'Zs'


def emit(name, rs):
    print('const uint32_t %s[][2] = {' % name)
    for i in range(0, len(rs), 4):
        print('    ' + ' '.join('{0x%05X, 0x%05X},' % r for r in rs[i:i + 4]))
    print('};')
    print('const size_t %s_len = %d;' % (name, len(rs)))
    print()


NFC_UNICODE_VERSION = (9, 0)
DERIVED_AGE = '/usr/share/unicode/DerivedAge.txt'


def assigned_by(version):
    """Code points assigned in Unicode `version` or earlier."""
    out = set()
    with open(DERIVED_AGE, encoding='utf-8') as f:
        for line in f:
            line = line.split('#')[0].strip()
            if not line:
                continue
            rng, age = [x.strip() for x in line.split(';')]
            if tuple(int(x) for x in age.split('.')) > version:
                continue
            lo, _, hi = rng.partition('..')
            out.update(range(int(lo, 16), int(hi or lo, 16) + 1))
    return out


def emit_nfc():
    old = assigned_by(NFC_UNICODE_VERSION)
    ccc = []  # (lo, hi, class) runs of equal nonzero class
    for cp in range(0x110000):
        c = unicodedata.combining(chr(cp)) if cp in old else 0
        if c and ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == c:
            ccc[-1][1] = cp
        elif c:
            ccc.append([cp, cp, c])
    nfd, comp = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or 0xAC00 <= cp <= 0xD7A3 or cp not in old:
            continue
        ch = chr(cp)
        d = unicodedata.normalize('NFD', ch)
        if d != ch:
            assert len(d) <= 4
            nfd.append([cp] + [ord(x) for x in d] + [0] * (4 - len(d)))
        m = unicodedata.decomposition(ch)
        if m and not m.startswith('<'):
            parts = [int(x, 16) for x in m.split()]
            # a primary composite: its two-part mapping composes back (exclusions do not)
            if len(parts) == 2 and unicodedata.normalize('NFC', chr(parts[0]) + chr(parts[1])) == ch:
                comp.append((parts[0], parts[1], cp))
    comp.sort()
    # tokenizer.c skips NFC for text without a code point >= U+0300; that is sound only if
    # nothing below U+0300 changes under NFC nor composes with what follows it there
    assert all(unicodedata.normalize('NFC', chr(cp)) == chr(cp) for cp in range(0x300))
    assert all(b >= 0x300 for _, b, _ in comp)
    print('/* (lo, hi, canonical combining class) for every nonzero class */')
    print('const uint32_t flx_tok_ccc_ranges[][3] = {')
    for i in range(0, len(ccc), 3):
        print('    ' + ' '.join('{0x%05X, 0x%05X, %d},' % tuple(r) for r in ccc[i:i + 3]))
    print('};')
    print('const size_t flx_tok_ccc_ranges_len = %d;' % len(ccc))
    print()
    print('/* (code point, its full canonical decomposition padded with 0), by code point */')
    print('const uint32_t flx_tok_nfd_map[][5] = {')
    for i in range(0, len(nfd), 2):
        print('    ' + ' '.join('{0x%05X, 0x%05X, 0x%05X, 0x%05X, 0x%05X},' % tuple(r) for r in nfd[i:i + 2]))
    print('};')
    print('const size_t flx_tok_nfd_map_len = %d;' % len(nfd))
    print()
    print('/* (first, second, composite) primary composites, by (first, second) */')
    print('const uint32_t flx_tok_comp_map[][3] = {')
    for i in range(0, len(comp), 3):
        print('    ' + ' '.join('{0x%05X, 0x%05X, 0x%05X},' % r for r in comp[i:i + 3]))
    print('};')
    print('const size_t flx_tok_comp_map_len = %d;' % len(comp))


def main():
    letters = ranges(lambda cp: cat(cp)[0] == 'L')
    numbers = ranges(lambda cp: cat(cp)[0] == 'N')
    spaces = ranges(is_space)
    print('/* Generated by decode/tools/gen_unicode_tables.py from Python unicodedata %s; do not edit. */'
          % unicodedata.unidata_version)
    print('/* Declared in tokenizer.c, the only user. */')
    print('#include <stddef.h>')
    print('#include <stdint.h>')
    print()
    print('const char flx_tok_unicode_version[] = "%s";' % unicodedata.unidata_version)
    print('/* NFC tables: characters assigned by Unicode %d.%d only (see the generator). */' % NFC_UNICODE_VERSION)
    print()
    emit('flx_tok_letter_ranges', letters)
    emit('flx_tok_number_ranges', numbers)
    emit('flx_tok_space_ranges', spaces)
    emit_nfc()


if __name__ == '__main__':
    sys.exit(main())
