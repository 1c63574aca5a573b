#!/usr/bin/python3
"""A router's view of fluxion-decoded with nothing but Debian's python3-grpcio and python3-protobuf.

The .proto files are compiled and the calls made by scripts/fluxion_client.py (protoc into a
temporary folder, channel.unary_unary / unary_stream with the messages' serializers, no gRPC stubs).
test_node_grpc runs it against a node in --prefill local mode:

  node_client.py --target HOST:PORT --model-id ID --prompt 1,2,3 --expect 7,8,9

It checks NodeStatus, OpenSession -> WaitReady -> Generate (the tokens must be --expect, in
order, with per-token timing), GetSession / CloseSession afterwards, the health service, and
that malformed bytes are INVALID_ARGUMENT and an unknown session NOT_FOUND. Exit 0 when all hold.
"""
import argparse
import os
import sys

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from fluxion_client import Node, compile_protos  # noqa: E402  (the router's client: the same protos, calls)


def fail(msg):
    print("node_client.py: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--model-id", required=True)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--expect", required=True)
    a = ap.parse_args()
    prompt = [int(x) for x in a.prompt.split(",")]
    expect = [int(x) for x in a.expect.split(",")]

    pb, hpb = compile_protos()
    node = Node(a.target, pb)
    ch, unary = node.ch, node.unary
    svc = "/fluxion.decode.v1.DecodeNode/"

    st = unary("NodeStatus", pb.NodeStatusRequest(), pb.NodeStatusResponse)
    if st.model_id != a.model_id or st.prefill_mode != pb.PREFILL_MODE_LOCAL:
        fail("NodeStatus: %s" % st)

    r = unary("OpenSession", pb.OpenSessionRequest(
        model_id=st.model_id, shape=st.shape, prompt_len=len(prompt), max_new_tokens=len(expect),
        kv_dtype=pb.KV_DTYPE_BF16, attention=pb.AttentionConfig(mode=pb.ATTENTION_MODE_FULL),
        local_prefill=pb.LocalPrefill(token_ids=prompt)), pb.OpenSessionResponse)
    if len(r.transfer_token) != 16:
        fail("transfer token of %d bytes" % len(r.transfer_token))
    info = unary("WaitReady", pb.WaitReadyRequest(session_id=r.session_id, timeout_ms=30000), pb.SessionInfo)
    if info.state != pb.SESSION_STATE_READY:
        fail("WaitReady: %s" % info)

    gen = ch.unary_stream(svc + "Generate", request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.GenerateResponse.FromString)
    got = []
    for m in gen(pb.GenerateRequest(session_id=r.session_id,
                                    stop=pb.StopConditions(max_new_tokens=len(expect))), timeout=60):
        if m.index != len(got):
            fail("message %d has index %d" % (len(got), m.index))
        if m.index > 0 and (m.timing.step_us == 0 or m.stats.heads == 0):
            fail("token %d without step timing or statistics" % m.index)
        got.append(m.token_id)
    if got != expect:
        fail("tokens %s, expected %s" % (got, expect))
    if m.finish_reason != pb.FINISH_REASON_MAX_NEW_TOKENS:
        fail("finish reason %d" % m.finish_reason)

    info = unary("GetSession", pb.GetSessionRequest(session_id=r.session_id), pb.SessionInfo)
    if info.state != pb.SESSION_STATE_CLOSED or info.tokens_generated != len(expect):
        fail("GetSession after Generate: %s" % info)
    closed = unary("CloseSession", pb.CloseSessionRequest(session_id=r.session_id), pb.CloseSessionResponse)
    if closed.previous_state != pb.SESSION_STATE_CLOSED:
        fail("CloseSession: %s" % closed)

    h = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=hpb.HealthCheckResponse.FromString)(hpb.HealthCheckRequest(), timeout=10)
    if h.status != hpb.HealthCheckResponse.SERVING:
        fail("health: %s" % h)

    raw = ch.unary_unary(svc + "OpenSession", request_serializer=lambda b: b,
                         response_deserializer=lambda b: b)
    for bad, code in ((b"\xff\xff\xff\xff\x0f", grpc.StatusCode.INVALID_ARGUMENT),):
        try:
            raw(bad, timeout=10)
            fail("malformed OpenSession accepted")
        except grpc.RpcError as e:
            if e.code() != code:
                fail("malformed OpenSession: %s %s" % (e.code(), e.details()))
    try:
        unary("GetSession", pb.GetSessionRequest(session_id=12345), pb.SessionInfo)
        fail("unknown session found")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            fail("unknown session: %s %s" % (e.code(), e.details()))
    print("node_client.py: ok (%d tokens)" % len(got), file=sys.stderr)


if __name__ == "__main__":
    main()
