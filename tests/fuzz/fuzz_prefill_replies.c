/*
 * fuzz_prefill_replies - bytes as the decode node's answers that a prefill node reads over gRPC
 * (flx/prefill_control.h: flx_pfx_parse_node_status, flx_pfx_parse_open_session, what flx-prefill
 * --control runs). Byte 0 picks the answer (bit 0: NodeStatus or OpenSession); the rest is the
 * message. An accepted answer hands out only fields inside their documented ranges, its strings
 * NUL-terminated without control characters (the host printable ASCII); a refusal leaves a message
 * and does not touch the output.
 */
#include "fuzz_util.h"

#include <stdint.h>
#include <string.h>

#include "flx/log.h"
#include "flx/prefill_control.h"

/* 1 .. cap - 1 bytes, NUL-terminated, no control character; ascii: printable ASCII, no space. */
static int clean(const char *s, size_t cap, int ascii)
{
    const size_t n = strnlen(s, cap);
    if (n == 0 || n == cap) return 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || (ascii && (c == 0x20 || c > 0x7e))) return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    flx_log_set_level(FLX_LOG_ERROR);
    if (size < 1) return 0;
    const uint8_t sel = data[0];
    data++;
    size--;
    if (sel & 1) {
        flx_pfx_session_t s, before;
        memset(&s, 0xa5, sizeof s);
        before = s;
        if (flx_pfx_parse_open_session(data, size, &s) == FLX_OK) {
            FUZZ_CHECK(s.sid != 0 && s.port != 0);
            FUZZ_CHECK(clean(s.host, sizeof s.host, 1));
        } else {
            FUZZ_CHECK(flx_error_msg()[0] && !memcmp(&s, &before, sizeof s));
        }
    } else {
        flx_pfx_node_t n, before;
        memset(&n, 0xa5, sizeof n);
        before = n;
        if (flx_pfx_parse_node_status(data, size, &n) == FLX_OK) {
            FUZZ_CHECK(clean(n.model_id, sizeof n.model_id, 0));
            FUZZ_CHECK(n.n_layers >= 1 && n.n_layers <= 1024 && n.n_kv_heads >= 1 && n.n_kv_heads <= 1024);
            FUZZ_CHECK(n.n_q_heads >= n.n_kv_heads && n.n_q_heads % n.n_kv_heads == 0 &&
                       n.n_q_heads <= FLX_TP_MAX_Q_HEADS);
            FUZZ_CHECK(n.head_dim >= 16 && n.head_dim <= 256 && n.head_dim % 16 == 0);
        } else {
            FUZZ_CHECK(flx_error_msg()[0] && !memcmp(&n, &before, sizeof n));
        }
    }
    return 0;
}
