/*
 * token_ids.c - token id files (flx/tokenizer.h: flx_tok_ids_parse, flx_tok_ids_read): the
 * teacher-forced inputs flx-model-dump and bench/model take, as llama_ref writes them.
 *
 * DESIGN
 * Two encodings share one reader, told apart by their bytes: text (decimal integers separated by
 * whitespace; only digits, '-' and whitespace occur) or raw little-endian i32 (anything else). The
 * text form is parsed by hand rather than by strtol, which needs a terminator the bytes may not
 * have, and the result is sized by the bytes themselves (at most one id per two bytes of text, one
 * per four of raw), so a file never makes the reader allocate more than twice its own size.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "flx/cli.h"
#include "flx/tokenizer.h"

flx_status_t flx_tok_ids_parse(const char *what, const void *buf, size_t len, int32_t **ids_p, size_t *n_p)
{
    if (!what || (!buf && len) || !ids_p || !n_p) return flx_error_set(FLX_ERR_INVALID, "token ids: NULL argument");
    const unsigned char *b = buf;
    int text = 1;
    for (size_t i = 0; i < len && text; i++) text = isdigit(b[i]) || b[i] == '-' || isspace(b[i]);
    if (!text && len % 4)
        return flx_error_set(FLX_ERR_FORMAT, "%s: %zu bytes is not a whole number of i32 ids (and not text)", what,
                             len);
    int32_t *ids = malloc((text ? len / 2 + 1 : len / 4) * sizeof *ids + 1);
    if (!ids) return flx_error_set(FLX_ERR_NOMEM, "%s: out of memory for the ids of %zu bytes", what, len);
    size_t n = 0;
    if (!text) {
        n = len / 4;
        memcpy(ids, b, len);
    }
    for (size_t i = 0; text && i < len;) {
        if (isspace(b[i])) {
            i++;
            continue;
        }
        size_t at = i;
        int neg = b[i] == '-';
        i += neg;
        int64_t v = 0;
        size_t digits = 0;
        for (; i < len && isdigit(b[i]); i++, digits++)
            if ((v = v * 10 + (b[i] - '0')) > (int64_t)INT32_MAX + 1) break;
        if (neg) v = -v;
        if (!digits || v < INT32_MIN || v > INT32_MAX || (i < len && !isspace(b[i]))) {
            free(ids);
            return flx_error_set(FLX_ERR_FORMAT, "%s: bad token id at byte %zu (integers in -2^31..2^31-1 separated by "
                                 "whitespace)", what, at);
        }
        ids[n++] = (int32_t)v;
    }
    *ids_p = ids;
    *n_p = n;
    return FLX_OK;
}

flx_status_t flx_tok_ids_read(const char *path, int32_t **ids_p, size_t *n_p)
{
    char *buf = NULL;
    size_t len = 0;
    flx_status_t st = flx_cli_read_file(path, (size_t)1 << 32, &buf, &len);
    if (st) return st;
    st = flx_tok_ids_parse(path, buf, len, ids_p, n_p);
    free(buf);
    return st;
}
