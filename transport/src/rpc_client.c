/*
 * rpc_client.c - the blocking gRPC client of flx/rpc.h (prefill stub, tests, benchmarks).
 *
 * DESIGN
 * One insecure channel per client; every call gets its own completion queue, so calls on
 * different threads never steal each other's completions and a stream can be read at its own
 * pace. A unary call is one batch with all six client ops. A stream starts its status batch at
 * once (RECV_STATUS_ON_CLIENT completes only when the call is over, so it is known however the
 * call ends) and one receive batch per message asked for; RECV_INITIAL_METADATA is always posted
 * (without it the status can wait until the deadline, PLATFORM-NOTES).
 */
#include "flx/rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flx/util.h"
#include "rpc_internal.h"

struct flx_rpc_client {
    grpc_channel *ch;
};

struct flx_rpc_stream {
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata_array md_init, md_trail;
    grpc_status_code code;
    grpc_slice details;
    grpc_byte_buffer *req;                /* the request, kept until the call is freed */
    grpc_byte_buffer *recv;
    int tag_start, tag_status, tag_msg;   /* addresses are the tags */
    int start_done, status_done, msg_pending;
};

flx_status_t flx_rpc_client_create(const char *target, size_t max_recv_bytes, flx_rpc_client_h *client_p)
{
    if (!target || !*target || !client_p)
        return flx_error_set(FLX_ERR_INVALID, "rpc client: target is required");
    if (max_recv_bytes > INT32_MAX)
        return flx_error_set(FLX_ERR_INVALID, "rpc client: max_recv_bytes %zu above %d", max_recv_bytes, INT32_MAX);
    struct flx_rpc_client *c = calloc(1, sizeof *c);
    if (!c)
        return flx_error_set(FLX_ERR_NOMEM, "rpc client");
    grpc_init();
    grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                    .value.integer = (int)max_recv_bytes};
    grpc_channel_args args = {.num_args = max_recv_bytes ? 1 : 0, .args = &arg};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(target, creds, &args);
    grpc_channel_credentials_release(creds);
    if (!c->ch) {
        grpc_shutdown();
        free(c);
        return flx_error_set(FLX_ERR_INVALID, "rpc client: cannot make a channel to %s", target);
    }
    *client_p = c;
    return FLX_OK;
}

void flx_rpc_client_destroy(flx_rpc_client_h c)
{
    if (!c)
        return;
    grpc_channel_destroy(c->ch);
    grpc_shutdown();
    free(c);
}

static void result_set(flx_rpc_result_t *res, grpc_status_code code, grpc_slice details)
{
    if (!res)
        return;
    res->code = (int)code;
    size_t n = GRPC_SLICE_LENGTH(details);
    if (n >= sizeof res->msg)
        n = sizeof res->msg - 1;
    memcpy(res->msg, GRPC_SLICE_START_PTR(details), n);
    res->msg[n] = '\0';
}

/* A call of method on the client's channel, its completions on cq. */
static grpc_call *make_call(flx_rpc_client_h c, const char *method, uint32_t timeout_ms, grpc_completion_queue *cq)
{
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               flx_rpc_ms_from_now(timeout_ms), NULL);
    grpc_slice_unref(m);
    return call;
}

/* The four ops that send a request and close the client's side: initial metadata, the message,
 * the half-close, and the server's initial metadata (without it the status can wait until the
 * deadline). */
static void request_ops(grpc_op ops[4], grpc_byte_buffer *req, grpc_metadata_array *md_init)
{
    memset(ops, 0, 4 * sizeof *ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = md_init;
}

static void cq_drain_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

/* Waits for the completion tagged tag; other tags of the same call are handed to s (stream). */
static int wait_tag(grpc_completion_queue *cq, void *tag, struct flx_rpc_stream *s)
{
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return 0;
        if (s) {
            if (ev.tag == &s->tag_start) s->start_done = 1;
            if (ev.tag == &s->tag_status) s->status_done = 1;
            if (ev.tag == &s->tag_msg) s->msg_pending = 0;
        }
        if (ev.tag == tag)
            return 1;
    }
}

flx_status_t flx_rpc_unary(flx_rpc_client_h c, const char *method, const void *req, size_t len, uint32_t timeout_ms,
                           void **resp_p, size_t *resp_len_p, flx_rpc_result_t *res)
{
    if (!c || !method || (!req && len) || !resp_p || !resp_len_p || !res)
        return flx_error_set(FLX_ERR_INVALID, "rpc unary: NULL argument");
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_call *call = make_call(c, method, timeout_ms, cq);
    grpc_byte_buffer *bb = flx_rpc_bb_make(req, len), *rb = NULL;
    grpc_metadata_array md_init, md_trail;
    grpc_metadata_array_init(&md_init);
    grpc_metadata_array_init(&md_trail);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    request_ops(ops, bb, &md_init);
    memset(&ops[4], 0, 2 * sizeof ops[0]);
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &rb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md_trail;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    int tag;
    flx_status_t st = FLX_OK;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, &tag, NULL);
    if (e != GRPC_CALL_OK)
        st = flx_error_set(FLX_ERR_INTERNAL, "rpc unary %s: batch refused: %s", method, grpc_call_error_to_string(e));
    else
        wait_tag(cq, &tag, NULL);
    if (!st) {
        void *resp = NULL;
        size_t rlen = 0;
        if (code == GRPC_STATUS_OK && rb)
            st = flx_rpc_bb_read(rb, &resp, &rlen);
        else if (code == GRPC_STATUS_OK && (resp = malloc(1)) == NULL)
            st = flx_error_set(FLX_ERR_NOMEM, "rpc unary response");
        if (!st) {
            result_set(res, code, details);
            *resp_p = resp;
            *resp_len_p = rlen;
        }
    }
    grpc_byte_buffer_destroy(bb);
    if (rb)
        grpc_byte_buffer_destroy(rb);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md_init);
    grpc_metadata_array_destroy(&md_trail);
    grpc_call_unref(call);
    cq_drain_destroy(cq);
    return st;
}

flx_status_t flx_rpc_stream_open(flx_rpc_client_h c, const char *method, const void *req, size_t len,
                                 uint32_t timeout_ms, flx_rpc_stream_h *stream_p)
{
    if (!c || !method || (!req && len) || !stream_p)
        return flx_error_set(FLX_ERR_INVALID, "rpc stream: NULL argument");
    struct flx_rpc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return flx_error_set(FLX_ERR_NOMEM, "rpc stream");
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->call = make_call(c, method, timeout_ms, s->cq);
    grpc_metadata_array_init(&s->md_init);
    grpc_metadata_array_init(&s->md_trail);
    s->details = grpc_empty_slice();
    s->code = GRPC_STATUS_UNKNOWN;
    s->req = flx_rpc_bb_make(req, len);
    grpc_op ops[4];
    request_ops(ops, s->req, &s->md_init);
    grpc_call_error e1 = grpc_call_start_batch(s->call, ops, 4, &s->tag_start, NULL);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->md_trail;
    ops[0].data.recv_status_on_client.status = &s->code;
    ops[0].data.recv_status_on_client.status_details = &s->details;
    grpc_call_error e2 = grpc_call_start_batch(s->call, ops, 1, &s->tag_status, NULL);
    if (e1 != GRPC_CALL_OK || e2 != GRPC_CALL_OK) {
        s->start_done = e1 != GRPC_CALL_OK;
        s->status_done = e2 != GRPC_CALL_OK;
        flx_rpc_stream_close(s);
        return flx_error_set(FLX_ERR_INTERNAL, "rpc stream %s: batch refused: %s", method,
                             grpc_call_error_to_string(e1 != GRPC_CALL_OK ? e1 : e2));
    }
    *stream_p = s;
    return FLX_OK;
}

flx_status_t flx_rpc_stream_next(flx_rpc_stream_h s, void **msg_p, size_t *len_p, flx_rpc_result_t *res)
{
    if (!s || !msg_p || !len_p || !res)
        return flx_error_set(FLX_ERR_INVALID, "rpc stream next: NULL argument");
    if (!s->status_done) {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_MESSAGE;
        op.data.recv_message.recv_message = &s->recv;
        s->recv = NULL;
        s->msg_pending = 1;
        if (grpc_call_start_batch(s->call, &op, 1, &s->tag_msg, NULL) != GRPC_CALL_OK)
            s->msg_pending = 0;
        else
            wait_tag(s->cq, &s->tag_msg, s);
        if (s->recv) {
            flx_status_t st = flx_rpc_bb_read(s->recv, msg_p, len_p);
            grpc_byte_buffer_destroy(s->recv);
            s->recv = NULL;
            return st ? st : 1;
        }
    }
    if (!s->status_done)
        wait_tag(s->cq, &s->tag_status, s);
    result_set(res, s->code, s->details);
    return FLX_OK;
}

void flx_rpc_stream_cancel(flx_rpc_stream_h s)
{
    if (s)
        grpc_call_cancel(s->call, NULL);
}

void flx_rpc_stream_close(flx_rpc_stream_h s)
{
    if (!s)
        return;
    if (!s->status_done) {
        grpc_call_cancel(s->call, NULL);
        wait_tag(s->cq, &s->tag_status, s);
    }
    if (!s->start_done)
        wait_tag(s->cq, &s->tag_start, s);
    if (s->msg_pending)
        wait_tag(s->cq, &s->tag_msg, s);
    if (s->recv)
        grpc_byte_buffer_destroy(s->recv);
    grpc_byte_buffer_destroy(s->req);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->md_init);
    grpc_metadata_array_destroy(&s->md_trail);
    grpc_call_unref(s->call);
    cq_drain_destroy(s->cq);
    free(s);
}
