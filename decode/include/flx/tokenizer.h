/*
 * flx/tokenizer.h - byte-level BPE tokenizer for the Llama-3.x, Qwen2.x and SmolLM2 families.
 *
 * OVERVIEW
 * The decode node and the prefill stub take text and show text; this module turns one into the
 * other with the model's own vocabulary. A tokenizer is loaded from
 *   - a Hugging Face tokenizer.json (model.type "BPE": vocab, merges as "a b" strings or [a, b]
 *     pairs, added_tokens, the pre_tokenizer config), plus tokenizer_config.json from the same
 *     folder when it exists (chat_template, bos_token, eos_token, add_bos_token); or
 *   - the vocabulary of a GGUF file (tokenizer.ggml.model "gpt2", tokenizer.ggml.pre naming the
 *     pre-tokenizer, tokens, token_type, merges, special ids, tokenizer.chat_template).
 *
 * Encoding follows Hugging Face tokenizers token for token (tests/decode/test_tokenizer_model.c
 * checks it against tok_ref.py on real and random text):
 *   1. added tokens (special ones such as <|im_start|> and non-special ones alike) are cut out of
 *      the text first, leftmost-longest, and map to their ids directly;
 *   2. each remaining span is NFC-normalized when the source asks for it (Qwen2's normalizer;
 *      tables generated from unicodedata and cut to Unicode 9.0, the version of HF's
 *      normalization crate; GGUF "qwen2" vocabularies get it too), then split by the
 *      pre-tokenizer named by the source:
 *        FLX_TOK_PRE_GPT2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *        FLX_TOK_PRE_SMOLLM  every \p{N} on its own (HF Digits(individual_digits)), then GPT2 on
 *                            each piece
 *        FLX_TOK_PRE_LLAMA3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *                            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *        FLX_TOK_PRE_QWEN2   as LLAMA3 with \p{N} single digits
 *      The matchers are hand-written over UTF-8 with Unicode class tables generated from Python's
 *      unicodedata (decode/tools/gen_unicode_tables.py); \s is Oniguruma's Unicode \s, the regex
 *      engine HF uses. A byte that is not part of valid UTF-8 counts as one "other" character, so
 *      any input encodes (its byte goes through the byte-level map like every other byte);
 *   3. each piece's bytes are mapped to GPT-2's bytes_to_unicode characters and merged by BPE
 *      rank (lowest rank first, leftmost on ties, as HF's merge loop does). With ignore_merges
 *      (Llama-3) a piece that is itself in the vocabulary is taken whole.
 * Decoding inverts the byte-level map per token; a token with a character outside the map is
 * copied raw (HF's ByteLevel decoder does the same). Output is raw bytes: a multi-byte character
 * split across tokens comes out whole only when both tokens are decoded together.
 *
 * Not implemented: normalizers other than none and NFC (refused), added-token lstrip/rstrip/
 * single_word flags (ignored), SentencePiece/Unigram models (refused). With NFC, decode gives the
 * normalized text back, as HF does.
 *
 * MEMORY. A tokenizer.json (at most 64 MiB) is read whole and parsed by cJSON (up to ~40 bytes per
 * byte of JSON while loading); its id space (highest id + 1) may exceed the tokens it holds by at
 * most 65536, refused otherwise naming the id's field, so the tables built from it (~40 bytes per
 * id, the token strings twice, ~32 bytes per merge) are bounded by the file. A GGUF vocabulary is
 * bounded by the GGUF reader's checks (flx/gguf.h) and builds the same tables.
 *
 * THREAD MODE
 * A tokenizer is immutable after load: any number of threads may call encode, decode, chat and
 * the getters on one handle at once. Encode allocates scratch memory per call (it is not on the
 * per-step decode path); decode and the getters never allocate.
 *
 * SIZES AND BUFFERS
 * encode/decode/chat write into caller buffers. When cap is too small they return
 * FLX_ERR_CAPACITY and, as the one exception to "out-params only on success", set the out count
 * to the size needed, so callers can size with cap 0 and call again. Text outputs (decode, chat)
 * count bytes without the terminating NUL but need room for it: cap >= len + 1.
 */
#ifndef FLX_TOKENIZER_H
#define FLX_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "flx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handle; create with flx_tok_load* or flx_tok_create, free with flx_tok_destroy. */
typedef struct flx_tok *flx_tok_h;

typedef enum {
    FLX_TOK_PRE_GPT2 = 0,
    FLX_TOK_PRE_SMOLLM = 1,
    FLX_TOK_PRE_LLAMA3 = 2,
    FLX_TOK_PRE_QWEN2 = 3,
} flx_tok_pre_t;

/* Loads from path: a GGUF file (by its .gguf name or its magic), a tokenizer.json (a file named
 * tokenizer.json also reads the tokenizer_config.json beside it, when there is one), or a
 * directory holding tokenizer.json (and optionally tokenizer_config.json). On success *tok_p
 * owns the tokenizer. Refusals name the file and field: FLX_ERR_FORMAT for malformed input, FLX_ERR_UNSUPPORTED for
 * well-formed input of a kind not handled (Unigram model, unknown pre-tokenizer). */
flx_status_t flx_tok_load(const char *path, flx_tok_h *tok_p);

/* tokenizer.json at json_path; config_path (tokenizer_config.json) may be NULL. */
flx_status_t flx_tok_load_json(const char *json_path, const char *config_path, flx_tok_h *tok_p);

/* The vocabulary stored in a GGUF file. */
flx_status_t flx_tok_load_gguf(const char *path, flx_tok_h *tok_p);

/* Accepts NULL. */
void flx_tok_destroy(flx_tok_h tok);

/* Token-type attributes (GGUF token_type / HF added_tokens). */
enum {
    FLX_TOK_ATTR_ADDED = 1u << 0,   /* matched in text before pre-tokenization */
    FLX_TOK_ATTR_SPECIAL = 1u << 1, /* control token: skipped by decode with FLX_TOK_SKIP_SPECIAL */
    FLX_TOK_ATTR_EOG = 1u << 2,     /* ends generation: EOS, <|im_end|>, <|eot_id|>, ... */
};

/* The parts of a tokenizer that a source provides; used by the loaders and by tests that build a
 * tokenizer in memory. Token strings are in the byte-level form the files store ("Ġthe"). */
typedef struct flx_tok_vocab {
    uint32_t n_tokens;
    const char *const *tokens;   /* (n_tokens) NUL-terminated; id = index; NULL or "" = unused id */
    const uint8_t *attrs;        /* (n_tokens) FLX_TOK_ATTR_* or NULL for all 0 */
    uint32_t n_merges;
    const char *const *merges;   /* (n_merges) "left right", rank = index; left is non-empty */
    flx_tok_pre_t pre;
    int ignore_merges;           /* a piece found whole in the vocabulary skips BPE (Llama-3) */
    int nfc;                     /* NFC-normalize text between added tokens first (Qwen2) */
    int32_t bos_id, eos_id;      /* -1 if none */
    int add_bos;                 /* the model expects BOS (flx_tok_add_bos_default) */
    const char *chat_template;   /* Jinja source or NULL */
} flx_tok_vocab_t;

/* Builds a tokenizer from the parts (copied; the caller keeps ownership of v). Tokens named
 * <|im_end|>, <|eot_id|>, <|eom_id|>, <|end_of_text|>, <|endoftext|>, <end_of_turn>, <|end|> and
 * the EOS get FLX_TOK_ATTR_EOG. Merges whose parts or result are not in the vocabulary refuse the
 * vocabulary (FLX_ERR_FORMAT, naming the merge). */
flx_status_t flx_tok_create(const flx_tok_vocab_t *v, flx_tok_h *tok_p);

/* Encodes len bytes of text (any bytes; NUL is an ordinary byte). add_bos prepends the BOS id
 * (FLX_ERR_STATE if the tokenizer has none). Writes up to cap ids; *n_p = the count, also on
 * FLX_ERR_CAPACITY (then it is the count needed and ids[0..cap) holds a prefix). */
flx_status_t flx_tok_encode(flx_tok_h tok, const char *text, size_t len, int add_bos, int32_t *ids,
                            size_t cap, size_t *n_p);

enum {
    FLX_TOK_SKIP_SPECIAL = 1u << 0, /* leave out tokens with FLX_TOK_ATTR_SPECIAL */
};

/* Decodes n ids into bytes at buf (NUL-terminated; *len_p excludes the NUL). An id outside the
 * vocabulary is FLX_ERR_INVALID. On FLX_ERR_CAPACITY *len_p is the byte count needed. */
flx_status_t flx_tok_decode(flx_tok_h tok, const int32_t *ids, size_t n, unsigned flags, char *buf,
                            size_t cap, size_t *len_p);

/* Decoded ids are bytes: a piece can end inside a character, and a model can emit byte tokens that
 * form no character at all. Copies len bytes of in to out (cap > 0 bytes, NUL-terminated) as valid
 * UTF-8: every byte that does not start a whole, shortest-form, non-surrogate character becomes
 * U+FFFD; a character that does not fit in cap - 1 bytes ends the copy. Returns the bytes written,
 * NUL excluded. in and out must not overlap. */
size_t flx_utf8_repair(const char *in, size_t len, char *out, size_t cap);

/* The stored string of id (byte-level form, e.g. "Ġthe"), NUL-terminated, valid while tok lives;
 * NULL for an id outside the vocabulary. */
const char *flx_tok_token_str(flx_tok_h tok, int32_t id);

/* The id of a stored token string, or -1. */
int32_t flx_tok_find(flx_tok_h tok, const char *str);

/* Token id files (teacher-forced inputs; llama_ref --tokens-out writes them): len bytes of text
 * (decimal integers in the i32 range separated by whitespace) or, when any other byte occurs, raw
 * little-endian i32. On success *ids_p is a new array (free() it) of *n_p ids; FLX_ERR_FORMAT
 * naming `what` and the byte offset otherwise. Ids are not checked against any vocabulary. */
flx_status_t flx_tok_ids_parse(const char *what, const void *buf, size_t len, int32_t **ids_p, size_t *n_p);
/* The same from a file ("-": stdin). */
flx_status_t flx_tok_ids_read(const char *path, int32_t **ids_p, size_t *n_p);

uint32_t flx_tok_vocab_size(flx_tok_h tok);
int32_t flx_tok_bos(flx_tok_h tok); /* -1 if none */
int32_t flx_tok_eos(flx_tok_h tok); /* -1 if none */
int flx_tok_add_bos_default(flx_tok_h tok);
flx_tok_pre_t flx_tok_pre(flx_tok_h tok);
unsigned flx_tok_attrs(flx_tok_h tok, int32_t id); /* 0 for an id outside the vocabulary */
/* 1 if id ends generation (EOS or an end-of-turn token). */
int flx_tok_is_eog(flx_tok_h tok, int32_t id);
/* The chat template source, or NULL if the source had none. */
const char *flx_tok_chat_template(flx_tok_h tok);

typedef struct flx_tok_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content; /* NUL-terminated */
} flx_tok_msg_t;

/* Renders messages with the tokenizer's chat template into buf (NUL-terminated, *len_p excludes
 * the NUL; on FLX_ERR_CAPACITY *len_p is the size needed). The template is recognised by its
 * markers, not interpreted:
 *   ChatML (SmolLM2-Instruct, Qwen2):  <|im_start|>role\ncontent<|im_end|>\n ... then
 *       <|im_start|>assistant\n if add_generation_prompt. If the template writes a literal default
 *       system message when the first message is not "system" (SmolLM2, Qwen2), it is written too.
 *   Llama-3:  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ... with content
 *       trimmed of surrounding whitespace, then <|start_header_id|>assistant<|end_header_id|>\n\n.
 *       BOS is not written: encode with add_bos. Llama-3.1's dated default system preamble
 *       ("Cutting Knowledge Date: ...") is not reproduced; pass a system message instead.
 * A template with neither marker is FLX_ERR_UNSUPPORTED; no template is FLX_ERR_NOT_FOUND. */
flx_status_t flx_tok_chat(flx_tok_h tok, const flx_tok_msg_t *msgs, size_t n_msgs, int add_generation_prompt,
                          char *buf, size_t cap, size_t *len_p);

/* The token ids of a prompt as the tools feed the model: text (len bytes), wrapped as one user
 * message with the chat template when chat, BOS added when the tokenizer adds one by default.
 * *ids_p is malloc'd (the caller frees it), *n_p >= 1; an empty prompt is FLX_ERR_INVALID. One
 * function for flx-generate and flx-prefill, so both prefill the same tokens. */
flx_status_t flx_tok_encode_prompt(flx_tok_h tok, const char *text, size_t len, int chat, int32_t **ids_p,
                                   size_t *n_p);

#ifdef __cplusplus
}
#endif
#endif
