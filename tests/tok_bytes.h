/*
 * tok_bytes.h - GPT-2's bytes_to_unicode (byte b -> the character byte-level BPE vocabularies store
 * for it, e.g. ' ' -> "Ġ"), written independently of the tokenizer's own table, for tests and fuzz
 * seeds that build vocabularies.
 */
#ifndef FLX_TOK_BYTES_H
#define FLX_TOK_BYTES_H

/* UTF-8 of byte b's character, NUL-terminated (1 or 2 bytes). */
static inline void byte_char(int b, char out[4])
{
    int n = 0, cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

#endif
