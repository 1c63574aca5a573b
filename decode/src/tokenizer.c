/*
 * tokenizer.c - byte-level BPE (see flx/tokenizer.h for what is matched and why).
 *
 * DESIGN
 * One tokenizer is a handful of flat arrays built once at load and never written again, so every
 * call is thread-safe without locks:
 *   - token strings in one pool, found by id through offsets and by string through an
 *     open-addressing hash table (FNV-1a, linear probing, load <= 1/2). Measured: SmolLM2's 49K
 *     GGUF vocabulary in ~30 ms, a 150K-token tokenizer.json in ~0.12 s of CPU, JSON included;
 *   - merges in a second open-addressing table keyed by the pair of ids (left << 32 | right),
 *     giving rank and result id; BPE runs on ids, never on strings;
 *   - each token's decoded bytes precomputed, so decode is a copy per token.
 * The pre-tokenizer regexes are matched by hand (one function per family, each alternative in the
 * regex's order with the backtracking worked out in comments) instead of linking a regex engine:
 * the four patterns are fixed, and a hand matcher cannot be slowed by pathological input. BPE
 * merges use a binary heap ordered by (rank, position), the order HF's Word::merge_all uses, so
 * equal-rank ties resolve the same way and long pieces stay O(n log n).
 */
#include "flx/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flx/gguf.h"
#include "flx/log.h"
#include "flx/util.h"

/* decode/src/unicode_tables.c (generated) */
extern const uint32_t flx_tok_letter_ranges[][2];
extern const size_t flx_tok_letter_ranges_len;
extern const uint32_t flx_tok_number_ranges[][2];
extern const size_t flx_tok_number_ranges_len;
extern const uint32_t flx_tok_space_ranges[][2];
extern const size_t flx_tok_space_ranges_len;
extern const uint32_t flx_tok_ccc_ranges[][3];
extern const size_t flx_tok_ccc_ranges_len;
extern const uint32_t flx_tok_nfd_map[][5];
extern const size_t flx_tok_nfd_map_len;
extern const uint32_t flx_tok_comp_map[][3];
extern const size_t flx_tok_comp_map_len;

#define TOK_MOD "tokenizer"
/* tokenizer.json and tokenizer_config.json: cJSON's tree takes up to ~40 bytes per byte of JSON. */
#define TOK_MAX_FILE (64u << 20)
/* Ids a tokenizer.json may leave unused below its highest id: the id space (max id + 1) sizes the
 * tables, so it is bounded by the tokens the file actually holds plus this. */
#define TOK_MAX_UNUSED_IDS 65536u
#define MERGE_EMPTY UINT64_MAX

struct flx_tok {
    uint32_t n_vocab;
    char *strs;         /* token strings, each NUL-terminated */
    uint32_t *str_off;  /* (n_vocab + 1) token i is strs[str_off[i] .. str_off[i+1] - 1) */
    uint8_t *dec;       /* decoded bytes of every token */
    uint32_t *dec_off;  /* (n_vocab + 1) token i decodes to dec[dec_off[i] .. dec_off[i+1]) */
    uint8_t *attrs;     /* (n_vocab) FLX_TOK_ATTR_* */
    uint32_t *vmap;     /* (vmap_mask + 1) id + 1 of the token hashed there, 0 = empty */
    uint32_t vmap_mask;
    uint64_t *mkey;     /* (mmap_mask + 1) left << 32 | right, MERGE_EMPTY = empty */
    uint32_t *mrank;    /* (mmap_mask + 1) */
    int32_t *mres;      /* (mmap_mask + 1) id of the merged token */
    uint32_t mmap_mask;
    int32_t *added;     /* (n_added) ids matched in text before pre-tokenization, longest first */
    uint32_t n_added;
    uint8_t added_first[32]; /* bitmap of the first bytes of added tokens */
    int32_t byte_id[256];    /* id of the one-byte token of each byte, -1 if the vocab lacks it */
    char byte_str[256][2];   /* UTF-8 of each byte's bytes_to_unicode character (< U+0144) */
    uint8_t byte_len[256];   /* 1 or 2 */
    flx_tok_pre_t pre;
    int ignore_merges;
    int nfc;                 /* NFC-normalize the text between added tokens (Qwen2's normalizer) */
    int32_t bos, eos;
    int add_bos;
    char *chat_template;
};

/* ---- Unicode classes ------------------------------------------------------------------------ */

enum { CL_OTHER = 0, CL_LETTER = 1, CL_NUMBER = 2, CL_SPACE = 3 };
#define CP_INVALID 0x110000u /* a byte that is not part of valid UTF-8 */

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0])
            hi = mid;
        else if (cp > r[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

static int cp_class(uint32_t cp)
{
    if (cp < 128) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CL_LETTER;
        if (cp >= '0' && cp <= '9') return CL_NUMBER;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return CL_SPACE;
        return CL_OTHER;
    }
    if (cp >= CP_INVALID) return CL_OTHER;
    if (in_ranges(flx_tok_letter_ranges, flx_tok_letter_ranges_len, cp)) return CL_LETTER;
    if (in_ranges(flx_tok_number_ranges, flx_tok_number_ranges_len, cp)) return CL_NUMBER;
    if (in_ranges(flx_tok_space_ranges, flx_tok_space_ranges_len, cp)) return CL_SPACE;
    return CL_OTHER;
}

/* Decodes the character at s[i] (i < end). Invalid, overlong, surrogate or truncated sequences
 * yield one byte with CP_INVALID. Returns the byte length. */
static size_t u8_next(const uint8_t *s, size_t i, size_t end, uint32_t *cp)
{
    uint8_t c = s[i];
    size_t n;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        n = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = CP_INVALID;
        return 1;
    }
    if (end - i < n) {
        *cp = CP_INVALID;
        return 1;
    }
    for (size_t k = 1; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) {
            *cp = CP_INVALID;
            return 1;
        }
        v = (v << 6) | (s[i + k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = CP_INVALID;
        return 1;
    }
    *cp = v;
    return n;
}

static size_t u8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
}

/* ---- GPT-2 bytes_to_unicode ----------------------------------------------------------------- */

/* Printable Latin-1 bytes map to themselves; the other 68 bytes to U+0100.. in byte order. */
static uint32_t byte_to_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

/* Inverse of byte_to_cp: -1 for a code point outside the map. */
static int cp_to_byte(uint32_t cp, const int16_t inv[324])
{
    return cp < 324 ? inv[cp] : -1;
}

/* ---- hashing -------------------------------------------------------------------------------- */

static uint64_t fnv1a(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint32_t table_size(uint32_t n)
{
    uint32_t cap = 16;
    while (cap < 2u * n) cap <<= 1;
    return cap;
}

static inline uint32_t tok_len(const struct flx_tok *t, uint32_t id)
{
    return t->str_off[id + 1] - t->str_off[id] - 1;
}

static int32_t vocab_find(const struct flx_tok *t, const char *s, size_t n)
{
    uint32_t i = (uint32_t)fnv1a(s, n) & t->vmap_mask;
    for (;;) {
        uint32_t e = t->vmap[i];
        if (!e) return -1;
        uint32_t id = e - 1;
        if (tok_len(t, id) == n && memcmp(t->strs + t->str_off[id], s, n) == 0) return (int32_t)id;
        i = (i + 1) & t->vmap_mask;
    }
}

static int merge_find(const struct flx_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *res)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)mix64(key) & t->mmap_mask;
    for (;;) {
        uint64_t k = t->mkey[i];
        if (k == MERGE_EMPTY) return 0;
        if (k == key) {
            *rank = t->mrank[i];
            *res = t->mres[i];
            return 1;
        }
        i = (i + 1) & t->mmap_mask;
    }
}

/* ---- construction --------------------------------------------------------------------------- */

static const char *const k_eog_names[] = {"<|im_end|>",   "<|eot_id|>",     "<|eom_id|>", "<|end_of_text|>",
                                          "<|endoftext|>", "<end_of_turn>", "<|end|>"};


typedef struct {
    uint32_t len;
    int32_t id;
} added_len_t;

static int cmp_added(const void *a, const void *b)
{
    const added_len_t *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

void flx_tok_destroy(flx_tok_h tok)
{
    if (!tok) return;
    free(tok->strs);
    free(tok->str_off);
    free(tok->dec);
    free(tok->dec_off);
    free(tok->attrs);
    free(tok->vmap);
    free(tok->mkey);
    free(tok->mrank);
    free(tok->mres);
    free(tok->added);
    free(tok->chat_template);
    free(tok);
}

flx_status_t flx_tok_create(const flx_tok_vocab_t *v, flx_tok_h *tok_p)
{
    flx_status_t st = FLX_OK;
    flx_tok_h t = NULL;
    int16_t inv[324];

    if (!v || !tok_p || (v->n_tokens && !v->tokens) || (v->n_merges && !v->merges))
        return flx_error_set(FLX_ERR_INVALID, "tokenizer: NULL vocabulary arrays");
    if (v->n_tokens == 0 || v->n_tokens > INT32_MAX / 2)
        return flx_error_set(FLX_ERR_FORMAT, "tokenizer: vocabulary size %u out of range", v->n_tokens);
    if (v->n_merges > INT32_MAX / 2)
        return flx_error_set(FLX_ERR_FORMAT, "tokenizer: %u merges out of range", v->n_merges);
    if ((unsigned)v->pre > FLX_TOK_PRE_QWEN2)
        return flx_error_set(FLX_ERR_INVALID, "tokenizer: pre-tokenizer %d unknown", (int)v->pre);
    if (v->bos_id >= (int64_t)v->n_tokens || v->eos_id >= (int64_t)v->n_tokens)
        return flx_error_set(FLX_ERR_FORMAT, "tokenizer: bos %d / eos %d outside the vocabulary of %u", v->bos_id,
                             v->eos_id, v->n_tokens);

    uint32_t n = v->n_tokens;
    t = calloc(1, sizeof(*t));
    if (!t) goto nomem;
    t->n_vocab = n;
    t->pre = v->pre;
    t->ignore_merges = !!v->ignore_merges;
    t->nfc = !!v->nfc;
    t->bos = v->bos_id < 0 ? -1 : v->bos_id;
    t->eos = v->eos_id < 0 ? -1 : v->eos_id;
    t->add_bos = !!v->add_bos && t->bos >= 0;

    /* strings */
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += (v->tokens[i] ? strlen(v->tokens[i]) : 0) + 1;
    if (total > UINT32_MAX / 2) {
        st = flx_error_set(FLX_ERR_FORMAT, "tokenizer: token strings total %zu bytes", total);
        goto fail;
    }
    t->strs = malloc(total);
    t->str_off = malloc((n + 1) * sizeof(uint32_t));
    t->dec = malloc(total);
    t->dec_off = malloc((n + 1) * sizeof(uint32_t));
    t->attrs = calloc(n, 1);
    t->vmap_mask = table_size(n) - 1;
    t->vmap = calloc((size_t)t->vmap_mask + 1, sizeof(uint32_t));
    if (!t->strs || !t->str_off || !t->dec || !t->dec_off || !t->attrs || !t->vmap) goto nomem;

    for (int i = 0; i < 324; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[byte_to_cp((uint8_t)b)] = (int16_t)b;

    size_t off = 0, doff = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *s = v->tokens[i] ? v->tokens[i] : "";
        size_t len = strlen(s);
        t->str_off[i] = (uint32_t)off;
        memcpy(t->strs + off, s, len + 1);
        off += len + 1;
        if (v->attrs) t->attrs[i] = v->attrs[i] & (FLX_TOK_ATTR_ADDED | FLX_TOK_ATTR_SPECIAL | FLX_TOK_ATTR_EOG);
        /* decoded bytes: invert the byte map, or the raw string if a character is outside it */
        t->dec_off[i] = (uint32_t)doff;
        size_t k = 0, d = doff;
        int raw = 0;
        while (k < len) {
            uint32_t cp;
            size_t cl = u8_next((const uint8_t *)s, k, len, &cp);
            int b = cp == CP_INVALID ? -1 : cp_to_byte(cp, inv);
            if (b < 0) {
                raw = 1;
                break;
            }
            t->dec[d++] = (uint8_t)b;
            k += cl;
        }
        if (raw) {
            memcpy(t->dec + doff, s, len);
            d = doff + len;
        }
        doff = d;
        if (len == 0) continue;
        /* first id wins for a string stored twice */
        uint32_t h = (uint32_t)fnv1a(s, len) & t->vmap_mask;
        int dup = 0;
        while (t->vmap[h]) {
            uint32_t o = t->vmap[h] - 1;
            if (tok_len(t, o) == len && memcmp(t->strs + t->str_off[o], s, len) == 0) {
                dup = 1;
                break;
            }
            h = (h + 1) & t->vmap_mask;
        }
        if (!dup) t->vmap[h] = i + 1;
    }
    t->str_off[n] = (uint32_t)off;
    t->dec_off[n] = (uint32_t)doff;

    for (int b = 0; b < 256; b++) {
        char c[4];
        size_t cl = u8_put(byte_to_cp((uint8_t)b), c);
        t->byte_id[b] = vocab_find(t, c, cl);
        memcpy(t->byte_str[b], c, cl);
        t->byte_len[b] = (uint8_t)cl;
    }

    /* merges */
    t->mmap_mask = table_size(v->n_merges) - 1;
    t->mkey = malloc(((size_t)t->mmap_mask + 1) * sizeof(uint64_t));
    t->mrank = malloc(((size_t)t->mmap_mask + 1) * sizeof(uint32_t));
    t->mres = malloc(((size_t)t->mmap_mask + 1) * sizeof(int32_t));
    if (!t->mkey || !t->mrank || !t->mres) goto nomem;
    memset(t->mkey, 0xFF, ((size_t)t->mmap_mask + 1) * sizeof(uint64_t));
    {
        char *cat = NULL;
        size_t cat_cap = 0;
        for (uint32_t r = 0; r < v->n_merges; r++) {
            const char *m = v->merges[r];
            const char *sp = m && m[0] ? strchr(m + 1, ' ') : NULL;
            if (!sp) {
                free(cat);
                st = flx_error_set(FLX_ERR_FORMAT, "tokenizer: merge %u '%s' is not 'left right'", r, m ? m : "");
                goto fail;
            }
            size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
            int32_t a = vocab_find(t, m, la), b = vocab_find(t, sp + 1, lb);
            if (la + lb + 1 > cat_cap) {
                cat_cap = 2 * (la + lb + 1);
                char *nc = realloc(cat, cat_cap);
                if (!nc) {
                    free(cat);
                    goto nomem;
                }
                cat = nc;
            }
            memcpy(cat, m, la);
            memcpy(cat + la, sp + 1, lb);
            int32_t c = vocab_find(t, cat, la + lb);
            if (a < 0 || b < 0 || c < 0) {
                free(cat);
                st = flx_error_set(FLX_ERR_FORMAT, "tokenizer: merge %u '%s' names a token not in the vocabulary", r,
                                   m);
                goto fail;
            }
            uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
            uint32_t h = (uint32_t)mix64(key) & t->mmap_mask;
            while (t->mkey[h] != MERGE_EMPTY && t->mkey[h] != key) h = (h + 1) & t->mmap_mask;
            if (t->mkey[h] == key) continue; /* a repeated merge keeps its first (lowest) rank */
            t->mkey[h] = key;
            t->mrank[h] = r;
            t->mres[h] = c;
        }
        free(cat);
    }

    /* added tokens, longest first so the first match at a position is the longest */
    for (uint32_t i = 0; i < n; i++)
        if ((t->attrs[i] & FLX_TOK_ATTR_ADDED) && tok_len(t, i) > 0) t->n_added++;
    if (t->n_added) {
        t->added = malloc(t->n_added * sizeof(int32_t));
        if (!t->added) goto nomem;
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            if ((t->attrs[i] & FLX_TOK_ATTR_ADDED) && tok_len(t, i) > 0) {
                t->added[k++] = (int32_t)i;
                uint8_t f = (uint8_t)t->strs[t->str_off[i]];
                t->added_first[f >> 3] |= (uint8_t)(1u << (f & 7));
            }
        }
        /* longest first, ties by id; a file may add any number, so no quadratic sort */
        added_len_t *al = malloc(t->n_added * sizeof *al);
        if (!al) goto nomem;
        for (uint32_t i = 0; i < t->n_added; i++) al[i] = (added_len_t){tok_len(t, (uint32_t)t->added[i]), t->added[i]};
        qsort(al, t->n_added, sizeof *al, cmp_added);
        for (uint32_t i = 0; i < t->n_added; i++) t->added[i] = al[i].id;
        free(al);
    }

    for (size_t k = 0; k < FLX_ARRAY_SIZE(k_eog_names); k++) {
        int32_t id = vocab_find(t, k_eog_names[k], strlen(k_eog_names[k]));
        if (id >= 0) t->attrs[id] |= FLX_TOK_ATTR_EOG;
    }
    if (t->eos >= 0) t->attrs[t->eos] |= FLX_TOK_ATTR_EOG;

    if (v->chat_template) {
        t->chat_template = strdup(v->chat_template);
        if (!t->chat_template) goto nomem;
    }
    *tok_p = t;
    return FLX_OK;

nomem:
    st = flx_error_set(FLX_ERR_NOMEM, "tokenizer: out of memory building a vocabulary of %u tokens", n);
fail:
    flx_tok_destroy(t);
    return st;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------- */

typedef struct span {
    const uint8_t *s;
    size_t end; /* the matchers never look at s[end] or beyond */
} span_t;

static inline int cls_at(const span_t *sp, size_t i, size_t *len, uint32_t *cp_out)
{
    uint32_t cp;
    *len = u8_next(sp->s, i, sp->end, &cp);
    if (cp_out) *cp_out = cp;
    return cp_class(cp);
}

static size_t run_of(const span_t *sp, size_t i, int cls, size_t max_chars)
{
    size_t n = 0, l;
    while (i < sp->end && n < max_chars && cls_at(sp, i, &l, NULL) == cls) {
        i += l;
        n++;
    }
    return i;
}

/* 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII-case-insensitive (and 'ſ, which folds to 's).
 * Returns the end of the match or 0. */
static size_t match_contraction(const span_t *sp, size_t p, int icase)
{
    const uint8_t *s = sp->s;
    if (s[p] != '\'' || p + 1 >= sp->end) return 0;
    uint8_t a = s[p + 1], b = p + 2 < sp->end ? s[p + 2] : 0;
    if (icase) {
        if (a >= 'A' && a <= 'Z') a = (uint8_t)(a + 32);
        if (b >= 'A' && b <= 'Z') b = (uint8_t)(b + 32);
        if (a == 0xC5 && b == 0xBF) return p + 3; /* U+017F */
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return p + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return p + 3;
    return 0;
}

/* \s+(?!\S)|\s+ at p (a space character): the whole run if it ends the span, else the run less
 * its last character, which then joins the next piece (" ?\p{L}+" etc.), unless that would leave
 * nothing, when \s+ takes the one character. */
static size_t match_space_tail(const span_t *sp, size_t p)
{
    size_t i = p, last = p, l, n = 0;
    while (i < sp->end && cls_at(sp, i, &l, NULL) == CL_SPACE) {
        last = i;
        i += l;
        n++;
    }
    if (i == sp->end || n == 1) return i;
    return last;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t next_gpt2(const span_t *sp, size_t p)
{
    size_t e = match_contraction(sp, p, 0), l0, l1;
    if (e) return e;
    int c0 = cls_at(sp, p, &l0, NULL);
    size_t q = p;
    int cq = c0;
    if (sp->s[p] == ' ' && p + 1 < sp->end) {
        q = p + 1;
        cq = cls_at(sp, q, &l1, NULL);
        if (cq == CL_SPACE) q = p, cq = c0; /* " ?" then a space: no piece starts here but \s */
    }
    if (cq == CL_LETTER || cq == CL_NUMBER || cq == CL_OTHER) return run_of(sp, q, cq, SIZE_MAX);
    return match_space_tail(sp, p);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t next_llama3(const span_t *sp, size_t p, size_t max_digits)
{
    const uint8_t *s = sp->s;
    size_t e = match_contraction(sp, p, 1), l0, l1;
    if (e) return e;
    int c0 = cls_at(sp, p, &l0, NULL);
    if (c0 == CL_LETTER) return run_of(sp, p, CL_LETTER, SIZE_MAX);
    int c1 = p + l0 < sp->end ? cls_at(sp, p + l0, &l1, NULL) : -1;
    if (c0 != CL_NUMBER && s[p] != '\r' && s[p] != '\n' && c1 == CL_LETTER)
        return run_of(sp, p + l0, CL_LETTER, SIZE_MAX);
    if (c0 == CL_NUMBER) return run_of(sp, p, CL_NUMBER, max_digits);
    size_t q = SIZE_MAX;
    if (c0 == CL_OTHER)
        q = p;
    else if (s[p] == ' ' && c1 == CL_OTHER)
        q = p + 1;
    if (q != SIZE_MAX) {
        e = run_of(sp, q, CL_OTHER, SIZE_MAX);
        while (e < sp->end && (s[e] == '\r' || s[e] == '\n')) e++;
        return e;
    }
    /* c0 is a space: \s*[\r\n]+ takes the run up to its last newline */
    size_t i = p, nl_end = 0, l;
    while (i < sp->end && cls_at(sp, i, &l, NULL) == CL_SPACE) {
        if (s[i] == '\r' || s[i] == '\n') nl_end = i + 1;
        i += l;
    }
    if (nl_end) return nl_end;
    return match_space_tail(sp, p);
}

/* ---- NFC ------------------------------------------------------------------------------------ */

/* UAX #15 with the generated tables: full canonical decomposition (Hangul by arithmetic), canonical
 * ordering of each run of nonzero combining classes, then canonical composition. A byte that is not
 * valid UTF-8 stays itself (held as CP_INVALID + byte: class 0, never composed). */

enum { H_SBASE = 0xAC00, H_LBASE = 0x1100, H_VBASE = 0x1161, H_TBASE = 0x11A7, H_LCOUNT = 19, H_VCOUNT = 21,
       H_TCOUNT = 28, H_NCOUNT = 588, H_SCOUNT = 11172 };

static unsigned ccc_of(uint32_t cp)
{
    if (cp < 0x300 || cp >= CP_INVALID) return 0;
    size_t lo = 0, hi = flx_tok_ccc_ranges_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < flx_tok_ccc_ranges[mid][0])
            hi = mid;
        else if (cp > flx_tok_ccc_ranges[mid][1])
            lo = mid + 1;
        else
            return flx_tok_ccc_ranges[mid][2];
    }
    return 0;
}

/* The full canonical decomposition of cp (up to 4, 0-padded), or NULL if cp is its own. */
static const uint32_t *nfd_of(uint32_t cp)
{
    size_t lo = 0, hi = flx_tok_nfd_map_len;
    if (cp < 0xC0 || cp >= CP_INVALID) return NULL;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < flx_tok_nfd_map[mid][0])
            hi = mid;
        else if (cp > flx_tok_nfd_map[mid][0])
            lo = mid + 1;
        else
            return &flx_tok_nfd_map[mid][1];
    }
    return NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    if (b < 0x300 || a >= CP_INVALID || b >= CP_INVALID) return 0;
    size_t lo = 0, hi = flx_tok_comp_map_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = flx_tok_comp_map[mid];
        if (a < e[0] || (a == e[0] && b < e[1]))
            hi = mid;
        else if (a > e[0] || b > e[1])
            lo = mid + 1;
        else
            return e[2];
    }
    return 0;
}

/* NFC of s[0, n) into a new buffer (*out_p, freed by the caller; *len_p bytes). */
static flx_status_t nfc_normalize(const uint8_t *s, size_t n, uint8_t **out_p, size_t *len_p)
{
    size_t cap = 4 * n + 4; /* a character decomposes into at most 4; a byte is at least one */
    uint32_t *cp = malloc(2 * cap * sizeof(uint32_t));
    uint8_t *out = NULL;
    if (!cp) goto nomem;
    uint32_t *tmp = cp + cap;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t l = u8_next(s, i, n, &c);
        if (c == CP_INVALID) c = CP_INVALID + s[i];
        i += l;
        const uint32_t *d;
        if (c >= H_SBASE && c < H_SBASE + H_SCOUNT) {
            uint32_t si = c - H_SBASE;
            cp[m++] = H_LBASE + si / H_NCOUNT;
            cp[m++] = H_VBASE + (si % H_NCOUNT) / H_TCOUNT;
            if (si % H_TCOUNT) cp[m++] = H_TBASE + si % H_TCOUNT;
        } else if ((d = nfd_of(c)) != NULL) {
            for (int k = 0; k < 4 && d[k]; k++) cp[m++] = d[k];
        } else {
            cp[m++] = c;
        }
    }
    /* canonical ordering: a stable sort of each run of nonzero classes, by class */
    for (size_t i = 0; i < m;) {
        if (ccc_of(cp[i]) == 0) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < m && ccc_of(cp[j]) != 0) j++;
        size_t cnt[257] = {0};
        for (size_t k = i; k < j; k++) cnt[ccc_of(cp[k]) + 1]++;
        for (int k = 1; k < 257; k++) cnt[k] += cnt[k - 1];
        for (size_t k = i; k < j; k++) tmp[cnt[ccc_of(cp[k])]++] = cp[k];
        memcpy(cp + i, tmp, (j - i) * sizeof(uint32_t));
        i = j;
    }
    /* composition: a character joins the last starter unless something between blocks it */
    size_t w = 0;
    long starter = -1;
    unsigned last = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cp[i], comp;
        unsigned cls = ccc_of(c);
        if (starter >= 0 && (w == (size_t)starter + 1 || (last != 0 && last < cls)) &&
            (comp = compose(cp[starter], c)) != 0) {
            cp[starter] = comp;
            continue;
        }
        if (cls == 0) starter = (long)w;
        last = cls;
        cp[w++] = c;
    }
    out = malloc(4 * w + 1);
    if (!out) goto nomem;
    size_t len = 0;
    for (size_t i = 0; i < w; i++) {
        uint32_t c = cp[i];
        if (c >= CP_INVALID) {
            out[len++] = (uint8_t)(c - CP_INVALID);
        } else if (c < 0x10000) {
            len += u8_put(c, (char *)out + len);
        } else {
            out[len++] = (uint8_t)(0xF0 | (c >> 18));
            out[len++] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
            out[len++] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
            out[len++] = (uint8_t)(0x80 | (c & 0x3F));
        }
    }
    free(cp);
    *out_p = out;
    *len_p = len;
    return FLX_OK;
nomem:
    free(cp);
    free(out);
    return flx_error_set(FLX_ERR_NOMEM, "tokenizer: no memory to normalize %zu bytes", n);
}

/* ---- BPE -------------------------------------------------------------------------------------- */

typedef struct heap_ent {
    uint32_t rank;
    uint32_t pos;
    int32_t res;
} heap_ent_t;

typedef struct out {
    int32_t *ids;
    size_t cap, n;
} out_t;

typedef struct scratch {
    size_t cap;       /* bytes of piece the arrays hold */
    int32_t *id;      /* (cap) symbol ids; -1 = merged away */
    int32_t *prev;    /* (cap) */
    int32_t *next;    /* (cap) -1 = last */
    heap_ent_t *heap; /* (3 cap) */
    char *mapped;     /* (2 cap) the piece in byte-level form */
} scratch_t;

static inline void out_push(out_t *o, int32_t id)
{
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

static int scratch_reserve(scratch_t *sc, size_t n)
{
    if (n <= sc->cap) return 0;
    size_t c = FLX_MAX(n, 2 * sc->cap);
    int32_t *id = realloc(sc->id, c * sizeof(int32_t));
    if (id) sc->id = id;
    int32_t *pv = realloc(sc->prev, c * sizeof(int32_t));
    if (pv) sc->prev = pv;
    int32_t *nx = realloc(sc->next, c * sizeof(int32_t));
    if (nx) sc->next = nx;
    heap_ent_t *h = realloc(sc->heap, 3 * c * sizeof(heap_ent_t));
    if (h) sc->heap = h;
    char *m = realloc(sc->mapped, 2 * c);
    if (m) sc->mapped = m;
    if (!id || !pv || !nx || !h || !m) return -1;
    sc->cap = c;
    return 0;
}

static void scratch_free(scratch_t *sc)
{
    free(sc->id);
    free(sc->prev);
    free(sc->next);
    free(sc->heap);
    free(sc->mapped);
}

static inline int heap_less(const heap_ent_t *a, const heap_ent_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(heap_ent_t *h, size_t *n, heap_ent_t e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent_t heap_pop(heap_ent_t *h, size_t *n)
{
    heap_ent_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static void try_pair(const struct flx_tok *t, scratch_t *sc, size_t *hn, int32_t left)
{
    int32_t right = sc->next[left];
    uint32_t rank;
    int32_t res;
    if (right < 0) return;
    if (merge_find(t, sc->id[left], sc->id[right], &rank, &res))
        heap_push(sc->heap, hn, (heap_ent_t){rank, (uint32_t)left, res});
}

static flx_status_t bpe_piece(const struct flx_tok *t, scratch_t *sc, const uint8_t *b, size_t n, out_t *o)
{
    if (n == 0) return FLX_OK;
    if (scratch_reserve(sc, n))
        return flx_error_set(FLX_ERR_NOMEM, "tokenizer: no memory for a piece of %zu bytes", n);
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(sc->mapped + m, t->byte_str[b[i]], 2);
            m += t->byte_len[b[i]];
        }
        int32_t id = vocab_find(t, sc->mapped, m);
        if (id >= 0) {
            out_push(o, id);
            return FLX_OK;
        }
    }
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[b[i]];
        if (id < 0) continue; /* HF drops a character the vocab lacks when there is no unk token */
        sc->id[ns] = id;
        sc->prev[ns] = ns - 1;
        sc->next[ns] = ns + 1;
        ns++;
    }
    if (ns == 0) return FLX_OK;
    sc->next[ns - 1] = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++) try_pair(t, sc, &hn, i);
    while (hn) {
        heap_ent_t e = heap_pop(sc->heap, &hn);
        int32_t l = (int32_t)e.pos, r;
        if (sc->id[l] < 0 || (r = sc->next[l]) < 0) continue;
        uint32_t rank;
        int32_t res;
        if (!merge_find(t, sc->id[l], sc->id[r], &rank, &res) || res != e.res) continue;
        sc->id[l] = res;
        sc->id[r] = -1;
        sc->next[l] = sc->next[r];
        if (sc->next[r] >= 0) sc->prev[sc->next[r]] = l;
        if (sc->prev[l] >= 0) try_pair(t, sc, &hn, sc->prev[l]);
        try_pair(t, sc, &hn, l);
    }
    for (int32_t i = 0; i >= 0; i = sc->next[i]) out_push(o, sc->id[i]);
    return FLX_OK;
}

/* Pre-tokenizes s[start, end) (no added tokens inside) and BPE-encodes every piece. */
static flx_status_t pretok_span(const struct flx_tok *t, scratch_t *sc, const uint8_t *s, size_t start, size_t end,
                                out_t *o)
{
    flx_status_t st;
    span_t sp = {s, end};
    size_t p = start, digit_at = start; /* SMOLLM: the next \p{N} at or after p (or end) */
    while (p < end) {
        size_t e, l;
        switch (t->pre) {
        case FLX_TOK_PRE_LLAMA3: e = next_llama3(&sp, p, 3); break;
        case FLX_TOK_PRE_QWEN2: e = next_llama3(&sp, p, 1); break;
        case FLX_TOK_PRE_SMOLLM:
            /* Digits(individual_digits) first: each \p{N} is a piece, and GPT-2's regex runs on the
             * text between digits as if it ended there ((?!\S) sees the end). */
            if (p >= digit_at) {
                digit_at = p;
                while (digit_at < end && cls_at(&sp, digit_at, &l, NULL) != CL_NUMBER) digit_at += l;
            }
            if (p == digit_at) {
                cls_at(&sp, p, &l, NULL);
                e = p + l;
            } else {
                span_t sub = {s, digit_at};
                e = next_gpt2(&sub, p);
            }
            break;
        default: e = next_gpt2(&sp, p); break;
        }
        if (FLX_NEVER(e <= p || e > end)) return flx_error_set(FLX_ERR_INTERNAL, "tokenizer: matcher stalled");
        if ((st = bpe_piece(t, sc, s + p, e - p, o))) return st;
        p = e;
    }
    return FLX_OK;
}

/* The text between two added tokens: normalized first when the tokenizer asks for NFC (nothing
 * below U+0300 changes under NFC, so text without a byte >= 0xCC is left as it is). */
static flx_status_t encode_span(const struct flx_tok *t, scratch_t *sc, const uint8_t *s, size_t start, size_t end,
                                out_t *o)
{
    if (t->nfc) {
        size_t i = start;
        while (i < end && s[i] < 0xCC) i++;
        if (i < end) {
            uint8_t *norm;
            size_t len;
            flx_status_t st = nfc_normalize(s + start, end - start, &norm, &len);
            if (st) return st;
            st = pretok_span(t, sc, norm, 0, len, o);
            free(norm);
            return st;
        }
    }
    return pretok_span(t, sc, s, start, end, o);
}

flx_status_t flx_tok_encode(flx_tok_h tok, const char *text, size_t len, int add_bos, int32_t *ids,
                            size_t cap, size_t *n_p)
{
    flx_status_t st = FLX_OK;
    scratch_t sc = {0};
    out_t o = {ids, ids ? cap : 0, 0};
    const uint8_t *s = (const uint8_t *)text;

    if (!tok || !n_p || (len && !text)) return flx_error_set(FLX_ERR_INVALID, "tokenizer: encode NULL argument");
    if (add_bos) {
        if (tok->bos < 0) return flx_error_set(FLX_ERR_STATE, "tokenizer: add_bos but the vocabulary has no bos");
        out_push(&o, tok->bos);
    }
    size_t seg = 0, p = 0;
    while (p < len) {
        if (tok->n_added && (tok->added_first[s[p] >> 3] & (1u << (s[p] & 7)))) {
            int32_t hit = -1;
            for (uint32_t k = 0; k < tok->n_added; k++) {
                int32_t id = tok->added[k];
                uint32_t l = tok_len(tok, (uint32_t)id);
                if (l <= len - p && memcmp(tok->strs + tok->str_off[id], s + p, l) == 0) {
                    hit = id;
                    break;
                }
            }
            if (hit >= 0) {
                if ((st = encode_span(tok, &sc, s, seg, p, &o))) goto out;
                out_push(&o, hit);
                p += tok_len(tok, (uint32_t)hit);
                seg = p;
                continue;
            }
        }
        p++;
    }
    if ((st = encode_span(tok, &sc, s, seg, len, &o))) goto out;
    *n_p = o.n;
    if (o.n > o.cap)
        st = flx_error_set(FLX_ERR_CAPACITY, "tokenizer: %zu ids do not fit in %zu", o.n, o.cap);
out:
    scratch_free(&sc);
    return st;
}

size_t flx_utf8_repair(const char *in, size_t len, char *out, size_t cap)
{
    static const char repl[3] = {(char)0xEF, (char)0xBF, (char)0xBD};   /* U+FFFD */
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        const size_t n = u8_next((const uint8_t *)in, i, len, &cp);
        const char *src = cp == CP_INVALID ? repl : in + i;
        const size_t w = cp == CP_INVALID ? sizeof repl : n;
        if (o + w > cap - 1)
            break;
        memcpy(out + o, src, w);
        o += w;
        i += n;
    }
    out[o] = '\0';
    return o;
}

flx_status_t flx_tok_decode(flx_tok_h tok, const int32_t *ids, size_t n, unsigned flags, char *buf,
                            size_t cap, size_t *len_p)
{
    if (!tok || !len_p || (n && !ids)) return flx_error_set(FLX_ERR_INVALID, "tokenizer: decode NULL argument");
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok->n_vocab)
            return flx_error_set(FLX_ERR_INVALID, "tokenizer: id %d at %zu outside the vocabulary of %u", ids[i], i,
                                 tok->n_vocab);
        if ((flags & FLX_TOK_SKIP_SPECIAL) && (tok->attrs[ids[i]] & FLX_TOK_ATTR_SPECIAL)) continue;
        need += tok->dec_off[ids[i] + 1] - tok->dec_off[ids[i]];
    }
    if (!buf || need + 1 > cap) {
        *len_p = need;
        return flx_error_set(FLX_ERR_CAPACITY, "tokenizer: decoded text of %zu bytes does not fit in %zu", need,
                             buf ? cap : 0);
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & FLX_TOK_SKIP_SPECIAL) && (tok->attrs[ids[i]] & FLX_TOK_ATTR_SPECIAL)) continue;
        uint32_t a = tok->dec_off[ids[i]], b = tok->dec_off[ids[i] + 1];
        memcpy(buf + off, tok->dec + a, b - a);
        off += b - a;
    }
    buf[off] = '\0';
    *len_p = off;
    return FLX_OK;
}

/* ---- getters -------------------------------------------------------------------------------- */

const char *flx_tok_token_str(flx_tok_h tok, int32_t id)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->n_vocab) return NULL;
    return tok->strs + tok->str_off[id];
}

int32_t flx_tok_find(flx_tok_h tok, const char *str)
{
    if (!tok || !str || !str[0]) return -1;
    return vocab_find(tok, str, strlen(str));
}

uint32_t flx_tok_vocab_size(flx_tok_h tok) { return tok ? tok->n_vocab : 0; }
int32_t flx_tok_bos(flx_tok_h tok) { return tok ? tok->bos : -1; }
int32_t flx_tok_eos(flx_tok_h tok) { return tok ? tok->eos : -1; }
int flx_tok_add_bos_default(flx_tok_h tok) { return tok ? tok->add_bos : 0; }
flx_tok_pre_t flx_tok_pre(flx_tok_h tok) { return tok ? tok->pre : FLX_TOK_PRE_GPT2; }
const char *flx_tok_chat_template(flx_tok_h tok) { return tok ? tok->chat_template : NULL; }

unsigned flx_tok_attrs(flx_tok_h tok, int32_t id)
{
    if (!tok || id < 0 || (uint32_t)id >= tok->n_vocab) return 0;
    return tok->attrs[id];
}

int flx_tok_is_eog(flx_tok_h tok, int32_t id)
{
    return (flx_tok_attrs(tok, id) & FLX_TOK_ATTR_EOG) != 0;
}

/* ---- loading: tokenizer.json ------------------------------------------------------------------ */

static const char k_pat_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                   "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_pat_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_pat_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A token named by a config field: a string or {"content": "..."}. NULL if absent or neither. */
static const char *json_token_content(const cJSON *v)
{
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static int json_flag(const cJSON *obj, const char *name, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* Picks the pre-tokenizer from the pre_tokenizer object. */
static flx_status_t json_pre(const char *path, const cJSON *pt, flx_tok_pre_t *pre_p)
{
    if (!cJSON_IsObject(pt))
        return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer missing or not an object", path);
    const cJSON *items = pt, *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    int seq = cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0;
    if (seq) {
        items = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(items))
            return flx_error_set(FLX_ERR_FORMAT, "%s: pre_tokenizer.pretokenizers is not an array", path);
    }
    int digits = 0, bytelevel = 0, bl_regex = 0;
    const char *split = NULL;
    const cJSON *it = seq ? items->child : pt;
    for (; it; it = seq ? it->next : NULL) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (!cJSON_IsString(ty)) return flx_error_set(FLX_ERR_FORMAT, "%s: pre_tokenizer entry without 'type'", path);
        if (strcmp(ty->valuestring, "Digits") == 0) {
            if (!json_flag(it, "individual_digits", 0))
                return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer Digits without individual_digits", path);
            digits = 1;
        } else if (strcmp(ty->valuestring, "ByteLevel") == 0) {
            bytelevel = 1;
            bl_regex = json_flag(it, "use_regex", 1);
            if (json_flag(it, "add_prefix_space", 0))
                return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel add_prefix_space true", path);
        } else if (strcmp(ty->valuestring, "Split") == 0) {
            const cJSON *pat = cJSON_GetObjectItemCaseSensitive(it, "pattern");
            const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
            const cJSON *beh = cJSON_GetObjectItemCaseSensitive(it, "behavior");
            if (!cJSON_IsString(re))
                return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer Split without pattern.Regex", path);
            if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0 || json_flag(it, "invert", 0))
                return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer Split behavior '%s' (want Isolated)",
                                     path, cJSON_IsString(beh) ? beh->valuestring : "?");
            if (split) return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer has two Split entries", path);
            split = re->valuestring;
        } else {
            return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s'", path, ty->valuestring);
        }
    }
    if (!bytelevel) return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer has no ByteLevel step", path);
    if (split) {
        if (bl_regex || digits)
            return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer Split combined with %s", path,
                                 digits ? "Digits" : "ByteLevel use_regex");
        if (strcmp(split, k_pat_llama3) == 0)
            *pre_p = FLX_TOK_PRE_LLAMA3;
        else if (strcmp(split, k_pat_qwen2) == 0)
            *pre_p = FLX_TOK_PRE_QWEN2;
        else if (strcmp(split, k_pat_gpt2) == 0)
            *pre_p = FLX_TOK_PRE_GPT2;
        else
            return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer Split pattern '%s'", path, split);
        return FLX_OK;
    }
    if (!bl_regex) return flx_error_set(FLX_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel without regex", path);
    *pre_p = digits ? FLX_TOK_PRE_SMOLLM : FLX_TOK_PRE_GPT2;
    return FLX_OK;
}

/* The first SpecialToken of post_processor's "single" template, the BOS a TemplateProcessing adds. */
static const char *json_post_bos(const cJSON *pp)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pp, "type");
    if (!cJSON_IsString(type)) return NULL;
    if (strcmp(type->valuestring, "Sequence") == 0) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(pp, "processors"))
        {
            const char *b = json_post_bos(it);
            if (b) return b;
        }
        return NULL;
    }
    if (strcmp(type->valuestring, "TemplateProcessing") != 0) return NULL;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *first = cJSON_IsArray(single) ? single->child : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(sp, "id");
    return cJSON_IsString(id) ? id->valuestring : NULL;
}

static int json_id(const cJSON *v, uint32_t *id)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < (double)(INT32_MAX / 2)) ||
        v->valuedouble != (double)(uint32_t)v->valuedouble)
        return -1;
    *id = (uint32_t)v->valuedouble;
    return 0;
}

flx_status_t flx_tok_load_json(const char *json_path, const char *config_path, flx_tok_h *tok_p)
{
    flx_status_t st;
    char *text = NULL, *ctext = NULL, *mbuf = NULL;
    size_t len, clen;
    cJSON *root = NULL, *conf = NULL;
    const char **tokens = NULL, **merges = NULL;
    uint8_t *attrs = NULL;
    flx_tok_h t = NULL;
    flx_tok_vocab_t v = {0};
    const char *P = json_path;

    if (!json_path || !tok_p) return flx_error_set(FLX_ERR_INVALID, "tokenizer: NULL path");
    if ((st = flx_file_read(json_path, TOK_MAX_FILE, &text, &len))) goto out;
    const char *stop = NULL;
    root = cJSON_ParseWithLengthOpts(text, len, &stop, 0);
    if (!cJSON_IsObject(root)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: not a JSON object (parse stopped near byte %td of %zu)", P,
                           stop ? stop - text : (ptrdiff_t)-1, len);
        goto out;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: missing field 'model'", P);
        goto out;
    }
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (cJSON_IsString(mtype) && strcmp(mtype->valuestring, "BPE") != 0) {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "%s: model.type '%s' (only BPE)", P, mtype->valuestring);
        goto out;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *mlist = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(vocab)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: missing field 'model.vocab'", P);
        goto out;
    }
    if (!cJSON_IsArray(mlist)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: missing field 'model.merges'", P);
        goto out;
    }
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: field 'added_tokens' is not an array", P);
        goto out;
    }
    if ((st = json_pre(P, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &v.pre))) goto out;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        if (!cJSON_IsString(nt) || strcmp(nt->valuestring, "NFC") != 0) {
            st = flx_error_set(FLX_ERR_UNSUPPORTED, "%s: normalizer '%s'", P,
                               cJSON_IsString(nt) ? nt->valuestring : "?");
            goto out;
        }
        v.nfc = 1;
    }

    /* ids: vocab and added_tokens together; the highest id sets the size of the id space, which
     * must not outgrow the tokens the file holds (a sparse id would size tables by itself) */
    uint32_t n = 0, id, n_entries = 0;
    const char *max_field = NULL, *max_tok = NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (json_id(it, &id)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: model.vocab entry '%s' has no valid id", P, it->string);
            goto out;
        }
        n_entries++;
        if (id + 1 > n) n = id + 1, max_field = "model.vocab", max_tok = it->string;
    }
    cJSON_ArrayForEach(it, added)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id) || !cJSON_IsString(c) || !c->valuestring[0]) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: added_tokens entry without valid 'id' and 'content'", P);
            goto out;
        }
        n_entries++;
        if (id + 1 > n) n = id + 1, max_field = "added_tokens", max_tok = c->valuestring;
    }
    if (n == 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: field 'model.vocab' is empty", P);
        goto out;
    }
    if (n - 1 >= n_entries + TOK_MAX_UNUSED_IDS) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: %s id %u ('%s') leaves %u ids unused: the file holds %u tokens and "
                           "may leave at most %u ids unused", P, max_field, n - 1, max_tok, n - n_entries,
                           n_entries, TOK_MAX_UNUSED_IDS);
        goto out;
    }
    tokens = calloc(n, sizeof(char *));
    attrs = calloc(n, 1);
    if (!tokens || !attrs) goto nomem;
    cJSON_ArrayForEach(it, vocab)
    {
        json_id(it, &id);
        if (tokens[id]) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: model.vocab id %u given to '%s' and '%s'", P, id, tokens[id],
                               it->string);
            goto out;
        }
        tokens[id] = it->string;
    }
    cJSON_ArrayForEach(it, added)
    {
        const char *c = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id);
        if (tokens[id] && strcmp(tokens[id], c) != 0) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: added_tokens id %u is '%s' but model.vocab has '%s'", P, id, c,
                               tokens[id]);
            goto out;
        }
        tokens[id] = c;
        attrs[id] |= FLX_TOK_ATTR_ADDED;
        if (json_flag(it, "special", 0)) attrs[id] |= FLX_TOK_ATTR_SPECIAL;
    }

    /* merges: "a b" strings, or [a, b] pairs joined into "a b" */
    uint32_t nm = (uint32_t)cJSON_GetArraySize(mlist);
    size_t mbytes = 0;
    cJSON_ArrayForEach(it, mlist)
    {
        if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
            cJSON_IsString(it->child->next))
            mbytes += strlen(it->child->valuestring) + strlen(it->child->next->valuestring) + 2;
        else if (!cJSON_IsString(it)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: model.merges entry is neither \"a b\" nor [a, b]", P);
            goto out;
        }
    }
    merges = calloc(nm ? nm : 1, sizeof(char *));
    mbuf = malloc(mbytes + 1);
    if (!merges || !mbuf) goto nomem;
    {
        uint32_t k = 0;
        char *w = mbuf;
        cJSON_ArrayForEach(it, mlist)
        {
            if (cJSON_IsString(it)) {
                merges[k++] = it->valuestring;
                continue;
            }
            merges[k++] = w;
            w += sprintf(w, "%s %s", it->child->valuestring, it->child->next->valuestring) + 1;
        }
    }

    v.n_tokens = n;
    v.tokens = tokens;
    v.attrs = attrs;
    v.n_merges = nm;
    v.merges = merges;
    v.ignore_merges = json_flag(model, "ignore_merges", 0);
    v.bos_id = v.eos_id = -1;

    /* BOS from the post-processor; tokenizer_config.json may name bos/eos and the template */
    const char *bos = json_post_bos(cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    const char *eos = NULL;
    int add_bos = bos != NULL;
    if (config_path) {
        if ((st = flx_file_read(config_path, TOK_MAX_FILE, &ctext, &clen))) goto out;
        conf = cJSON_ParseWithLength(ctext, clen);
        if (!cJSON_IsObject(conf)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: not a JSON object", config_path);
            goto out;
        }
        const char *b = json_token_content(cJSON_GetObjectItemCaseSensitive(conf, "bos_token"));
        if (b) bos = b;
        eos = json_token_content(cJSON_GetObjectItemCaseSensitive(conf, "eos_token"));
        add_bos = json_flag(conf, "add_bos_token", add_bos);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(conf, "chat_template");
        if (cJSON_IsString(ct)) {
            v.chat_template = ct->valuestring;
        } else if (cJSON_IsArray(ct)) { /* [{name, template}]: the "default" one, else the first */
            cJSON_ArrayForEach(it, ct)
            {
                const cJSON *nm_ = cJSON_GetObjectItemCaseSensitive(it, "name");
                const cJSON *tp = cJSON_GetObjectItemCaseSensitive(it, "template");
                if (!cJSON_IsString(tp)) continue;
                if (!v.chat_template || (cJSON_IsString(nm_) && strcmp(nm_->valuestring, "default") == 0))
                    v.chat_template = tp->valuestring;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        const char *name = k ? eos : bos;
        if (!name) continue;
        int32_t found = -1;
        for (uint32_t i = 0; i < n && found < 0; i++)
            if (tokens[i] && strcmp(tokens[i], name) == 0) found = (int32_t)i;
        if (found < 0) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: %s_token '%s' is not in the vocabulary", config_path ? config_path : P,
                               k ? "eos" : "bos", name);
            goto out;
        }
        if (k)
            v.eos_id = found;
        else
            v.bos_id = found;
    }
    v.add_bos = add_bos && v.bos_id >= 0;

    if ((st = flx_tok_create(&v, &t))) {
        char msg[FLX_ERROR_MSG_MAX]; /* name the file: the builder's message speaks of "tokenizer" */
        snprintf(msg, sizeof(msg), "%s", flx_error_msg());
        st = flx_error_set(st, "%s: %s", P, msg);
        goto out;
    }
    *tok_p = t;
    goto out;
nomem:
    st = flx_error_set(FLX_ERR_NOMEM, "%s: out of memory", P);
out:
    free(tokens);
    free(attrs);
    free(merges);
    free(mbuf);
    cJSON_Delete(root);
    cJSON_Delete(conf);
    free(text);
    free(ctext);
    return st;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

flx_status_t flx_tok_load(const char *path, flx_tok_h *tok_p)
{
    struct stat sb;
    char json[4096], conf[4096];
    if (!path || !tok_p) return flx_error_set(FLX_ERR_INVALID, "tokenizer: NULL path");
    if (stat(path, &sb) != 0) return flx_error_set(flx_status_from_errno(errno), "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(json, sizeof(json), "%s/tokenizer.json", path) >= sizeof(json) ||
            (size_t)snprintf(conf, sizeof(conf), "%s/tokenizer_config.json", path) >= sizeof(conf))
            return flx_error_set(FLX_ERR_INVALID, "%s: path too long", path);
        if (!is_file(json)) return flx_error_set(FLX_ERR_NOT_FOUND, "%s: no tokenizer.json in the folder", path);
        return flx_tok_load_json(json, is_file(conf) ? conf : NULL, tok_p);
    }
    if (ends_with(path, ".gguf")) return flx_tok_load_gguf(path, tok_p);
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (f) {
        size_t got = fread(magic, 1, 4, f);
        fclose(f);
        if (got == 4 && memcmp(magic, "GGUF", 4) == 0) return flx_tok_load_gguf(path, tok_p);
    }
    /* a sibling tokenizer_config.json belongs to a file named tokenizer.json */
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strcmp(base, "tokenizer.json") == 0) {
        int dl = (int)(base - path);
        if ((size_t)snprintf(conf, sizeof(conf), "%.*stokenizer_config.json", dl, path) >= sizeof(conf))
            return flx_error_set(FLX_ERR_INVALID, "%s: path too long", path);
        return flx_tok_load_json(path, is_file(conf) ? conf : NULL, tok_p);
    }
    return flx_tok_load_json(path, NULL, tok_p);
}

/* ---- chat templates ------------------------------------------------------------------------- */

typedef struct sbuf {
    char *buf;
    size_t cap, len;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (b->buf && b->len + n < b->cap) memcpy(b->buf + b->len, s, n);
    b->len += n;
}
static void sb_str(sbuf_t *b, const char *s) { sb_put(b, s, strlen(s)); }

/* The literal default system message of a ChatML template: '<|im_start|>system\n...<|im_end|>'
 * with nothing but text between (SmolLM2, Qwen2). Written into out (unescaped); 0 if none. */
static int chatml_default_system(const char *tpl, char *out, size_t cap)
{
    static const char open[] = "<|im_start|>system";
    if (!strstr(tpl, "'system'")) return 0;
    for (const char *p = strstr(tpl, open); p; p = strstr(p + 1, open)) {
        const char *q = p + sizeof(open) - 1;
        if (q[0] == '\n')
            q += 1;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *e = strstr(q, "<|im_end|>");
        if (!e || e == q) continue;
        size_t k = 0;
        int ok = 1;
        for (const char *c = q; c < e && ok; c++) {
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}' || k + 1 >= cap) {
                ok = 0;
            } else if (c[0] == '\\' && c[1] == 'n') {
                out[k++] = '\n';
                c++;
            } else {
                out[k++] = *c;
            }
        }
        if (!ok) continue;
        out[k] = '\0';
        return 1;
    }
    return 0;
}

static void put_trimmed(sbuf_t *b, const char *s)
{
    size_t n = strlen(s);
    while (n && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    sb_put(b, s, n);
}

flx_status_t flx_tok_chat(flx_tok_h tok, const flx_tok_msg_t *msgs, size_t n_msgs, int add_generation_prompt,
                          char *buf, size_t cap, size_t *len_p)
{
    if (!tok || !len_p || (n_msgs && !msgs)) return flx_error_set(FLX_ERR_INVALID, "tokenizer: chat NULL argument");
    for (size_t i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content)
            return flx_error_set(FLX_ERR_INVALID, "tokenizer: chat message %zu without role or content", i);
    const char *tpl = tok->chat_template;
    if (!tpl) return flx_error_set(FLX_ERR_NOT_FOUND, "tokenizer: the model has no chat template");
    sbuf_t b = {buf, buf ? cap : 0, 0};
    if (strstr(tpl, "<|im_start|>")) {
        char sys[1024];
        if ((n_msgs == 0 || strcmp(msgs[0].role, "system") != 0) && chatml_default_system(tpl, sys, sizeof(sys))) {
            sb_str(&b, "<|im_start|>system\n");
            sb_str(&b, sys);
            sb_str(&b, "<|im_end|>\n");
        }
        for (size_t i = 0; i < n_msgs; i++) {
            sb_str(&b, "<|im_start|>");
            sb_str(&b, msgs[i].role);
            sb_str(&b, "\n");
            sb_str(&b, msgs[i].content);
            sb_str(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) sb_str(&b, "<|im_start|>assistant\n");
    } else if (strstr(tpl, "<|start_header_id|>")) {
        for (size_t i = 0; i < n_msgs; i++) {
            sb_str(&b, "<|start_header_id|>");
            sb_str(&b, msgs[i].role);
            sb_str(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content);
            sb_str(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    } else {
        return flx_error_set(FLX_ERR_UNSUPPORTED,
                             "tokenizer: chat template not recognised (neither ChatML <|im_start|> nor Llama-3 "
                             "<|start_header_id|>): '%.60s...'",
                             tpl);
    }
    *len_p = b.len;
    if (!buf || b.len + 1 > cap)
        return flx_error_set(FLX_ERR_CAPACITY, "tokenizer: chat text of %zu bytes does not fit in %zu", b.len,
                             buf ? cap : 0);
    buf[b.len] = '\0';
    return FLX_OK;
}

/* ---- loading: GGUF ---------------------------------------------------------------------------- */

/* Copies the strings of a GGUF string array into one NUL-separated pool and a pointer table. */
static flx_status_t gguf_strings(const char *path, const char *key, const flx_gguf_array_t *a, char **pool_p,
                                 const char ***ptr_p)
{
    size_t total = 0, len;
    const char *s;
    if (a->elem != FLX_GGUF_STRING || a->n > INT32_MAX / 2)
        return flx_error_set(FLX_ERR_FORMAT, "%s: %s is not an array of at most 2^30 strings", path, key);
    for (uint64_t i = 0; i < a->n; i++) {
        if (flx_gguf_arr_str(a, i, &s, &len))
            return flx_error_set(FLX_ERR_FORMAT, "%s: %s element %llu is not a string", path, key,
                                 (unsigned long long)i);
        if (memchr(s, '\0', len))
            return flx_error_set(FLX_ERR_FORMAT, "%s: %s element %llu holds a NUL byte", path, key,
                                 (unsigned long long)i);
        total += len + 1;
    }
    char *pool = malloc(total ? total : 1);
    const char **ptr = malloc((a->n ? a->n : 1) * sizeof(char *));
    if (!pool || !ptr) {
        free(pool);
        free(ptr);
        return flx_error_set(FLX_ERR_NOMEM, "%s: no memory for %s", path, key);
    }
    size_t off = 0;
    for (uint64_t i = 0; i < a->n; i++) {
        flx_gguf_arr_str(a, i, &s, &len);
        memcpy(pool + off, s, len);
        pool[off + len] = '\0';
        ptr[i] = pool + off;
        off += len + 1;
    }
    *pool_p = pool;
    *ptr_p = ptr;
    return FLX_OK;
}

/* An optional token id key: -1 when absent; refused when present and outside [0, n). */
static flx_status_t gguf_opt_id(flx_gguf_h g, const char *path, const char *key, uint32_t n, int32_t *id)
{
    uint32_t v;
    flx_status_t st = flx_gguf_get_u32(g, key, &v);
    if (st == FLX_ERR_NOT_FOUND) {
        flx_error_clear();
        *id = -1;
        return FLX_OK;
    }
    if (st) return st;
    if (v >= n) return flx_error_set(FLX_ERR_FORMAT, "%s: %s %u outside the vocabulary of %u", path, key, v, n);
    *id = (int32_t)v;
    return FLX_OK;
}

flx_status_t flx_tok_load_gguf(const char *path, flx_tok_h *tok_p)
{
    flx_status_t st;
    flx_gguf_h g = NULL;
    char *tpool = NULL, *mpool = NULL;
    const char **tokens = NULL, **merges = NULL;
    uint8_t *attrs = NULL;
    flx_tok_h t = NULL;
    flx_tok_vocab_t v = {0};
    const char *s;
    const flx_gguf_array_t *tarr, *marr, *ty = NULL;

    if (!path || !tok_p) return flx_error_set(FLX_ERR_INVALID, "tokenizer: NULL path");
    if ((st = flx_gguf_open(path, &g))) return st;
    if ((st = flx_gguf_get_str(g, "tokenizer.ggml.model", &s))) goto out;
    if (strcmp(s, "gpt2") != 0) {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' (only byte-level BPE 'gpt2')", path, s);
        goto out;
    }
    st = flx_gguf_get_str(g, "tokenizer.ggml.pre", &s);
    if (st == FLX_ERR_NOT_FOUND) {
        flx_error_clear();
        flx_log_warn(TOK_MOD, "%s: no tokenizer.ggml.pre; using the GPT-2 pre-tokenizer", path);
        s = "gpt2";
    } else if (st) {
        goto out;
    }
    if (strcmp(s, "gpt2") == 0) {
        v.pre = FLX_TOK_PRE_GPT2;
    } else if (strcmp(s, "smollm") == 0) {
        v.pre = FLX_TOK_PRE_SMOLLM;
    } else if (strcmp(s, "llama-bpe") == 0 || strcmp(s, "llama3") == 0) {
        v.pre = FLX_TOK_PRE_LLAMA3;
        v.ignore_merges = 1;
    } else if (strcmp(s, "qwen2") == 0) {
        v.pre = FLX_TOK_PRE_QWEN2;
        v.nfc = 1; /* the GGUF does not say; Qwen2's tokenizer.json normalizes to NFC */
    } else {
        st = flx_error_set(FLX_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre '%s' (know gpt2, smollm, llama-bpe, qwen2)",
                           path, s);
        goto out;
    }

    if ((st = flx_gguf_get_arr(g, "tokenizer.ggml.tokens", &tarr))) goto out;
    if (tarr->n == 0) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", path);
        goto out;
    }
    if ((st = gguf_strings(path, "tokenizer.ggml.tokens", tarr, &tpool, &tokens))) goto out;
    uint32_t n = (uint32_t)tarr->n;
    st = flx_gguf_get_arr(g, "tokenizer.ggml.merges", &marr);
    if (st == FLX_ERR_NOT_FOUND) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: missing field 'tokenizer.ggml.merges'", path);
        goto out;
    }
    if (st) goto out;
    if ((st = gguf_strings(path, "tokenizer.ggml.merges", marr, &mpool, &merges))) goto out;

    attrs = calloc(n, 1);
    if (!attrs) {
        st = flx_error_set(FLX_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    st = flx_gguf_get_arr(g, "tokenizer.ggml.token_type", &ty);
    if (st == FLX_ERR_NOT_FOUND) {
        flx_error_clear();
        st = FLX_OK;
        ty = NULL;
    } else if (st) {
        goto out;
    } else if (ty->n != n) {
        st = flx_error_set(FLX_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu entries for %u tokens", path,
                           (unsigned long long)ty->n, n);
        goto out;
    }
    for (uint32_t i = 0; ty && i < n; i++) {
        int64_t k;
        if (flx_gguf_arr_int(ty, i, &k)) {
            st = flx_error_set(FLX_ERR_FORMAT, "%s: tokenizer.ggml.token_type element %u is not an integer", path, i);
            goto out;
        }
        if (k == 3) attrs[i] = FLX_TOK_ATTR_ADDED | FLX_TOK_ATTR_SPECIAL; /* CONTROL */
        if (k == 4) attrs[i] = FLX_TOK_ATTR_ADDED;                        /* USER_DEFINED */
    }
    int32_t eot, eom;
    if ((st = gguf_opt_id(g, path, "tokenizer.ggml.bos_token_id", n, &v.bos_id)) ||
        (st = gguf_opt_id(g, path, "tokenizer.ggml.eos_token_id", n, &v.eos_id)) ||
        (st = gguf_opt_id(g, path, "tokenizer.ggml.eot_token_id", n, &eot)) ||
        (st = gguf_opt_id(g, path, "tokenizer.ggml.eom_token_id", n, &eom)))
        goto out;
    if (eot >= 0) attrs[eot] |= FLX_TOK_ATTR_EOG;
    if (eom >= 0) attrs[eom] |= FLX_TOK_ATTR_EOG;
    int add_bos = 0;
    st = flx_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    if (st == FLX_ERR_NOT_FOUND) {
        flx_error_clear();
        add_bos = v.pre == FLX_TOK_PRE_LLAMA3; /* Llama-3 files written before the key existed */
    } else if (st) {
        goto out;
    }
    v.add_bos = add_bos;
    st = flx_gguf_get_str(g, "tokenizer.chat_template", &v.chat_template);
    if (st == FLX_ERR_NOT_FOUND) {
        flx_error_clear();
        v.chat_template = NULL;
    } else if (st) {
        goto out;
    }
    v.n_tokens = n;
    v.tokens = tokens;
    v.attrs = attrs;
    v.n_merges = (uint32_t)marr->n;
    v.merges = merges;
    if ((st = flx_tok_create(&v, &t))) {
        /* name the file: the builder's message speaks of "tokenizer" */
        char msg[FLX_ERROR_MSG_MAX];
        snprintf(msg, sizeof(msg), "%s", flx_error_msg());
        st = flx_error_set(st, "%s: %s", path, msg);
        goto out;
    }
    *tok_p = t;
out:
    free(tokens);
    free(tpool);
    free(merges);
    free(mpool);
    free(attrs);
    flx_gguf_close(g);
    return st;
}

flx_status_t flx_tok_encode_prompt(flx_tok_h tok, const char *text, size_t len, int chat, int32_t **ids_p,
                                   size_t *n_p)
{
    if (!tok || !text || !ids_p || !n_p) return flx_error_set(FLX_ERR_INVALID, "encode prompt: NULL argument");
    char *chat_text = NULL;
    int32_t *ids = NULL;
    flx_status_t st;
    if (chat) {
        char *content = malloc(len + 1);
        if (!content) return flx_error_set(FLX_ERR_NOMEM, "encode prompt: %zu bytes", len);
        memcpy(content, text, len);
        content[len] = 0;
        flx_tok_msg_t msg = {.role = "user", .content = content};
        size_t need = 0;
        st = flx_tok_chat(tok, &msg, 1, 1, NULL, 0, &need);
        if (st == FLX_ERR_CAPACITY) {
            chat_text = malloc(need + 1);
            st = chat_text ? flx_tok_chat(tok, &msg, 1, 1, chat_text, need + 1, &need)
                           : flx_error_set(FLX_ERR_NOMEM, "chat prompt of %zu bytes", need);
        }
        free(content);
        if (st) goto out;
        text = chat_text;
        len = need;
    }
    const int add_bos = flx_tok_add_bos_default(tok) && flx_tok_bos(tok) >= 0;
    size_t n = 0;
    st = flx_tok_encode(tok, text, len, add_bos, NULL, 0, &n);
    if (st && st != FLX_ERR_CAPACITY) goto out;
    if (n == 0) {
        st = flx_error_set(FLX_ERR_INVALID, "the prompt is empty");
        goto out;
    }
    if (!(ids = malloc(n * sizeof *ids))) {
        st = flx_error_set(FLX_ERR_NOMEM, "prompt of %zu tokens", n);
        goto out;
    }
    if ((st = flx_tok_encode(tok, text, len, add_bos, ids, n, &n))) goto out;
    *ids_p = ids;
    *n_p = n;
    ids = NULL;
out:
    free(ids);
    free(chat_text);
    return st;
}
