#!/usr/bin/python3
"""A router's view of fluxion-decoded with nothing but Debian's python3-grpcio and python3-protobuf.

The .proto files are compiled with protoc into a temporary folder at run time (nothing generated is
committed) and the calls are made with channel.unary_unary / unary_stream and the messages'
serializers: no gRPC stubs. test_node_grpc runs it against a node in --prefill local mode:

  node_client.py --target HOST:PORT --model-id ID --prompt 1,2,3 --expect 7,8,9

It checks NodeStatus, OpenSession -> WaitReady -> Generate (the tokens must be --expect, in
order, with per-token timing), GetSession / CloseSession afterwards, the health service, and
that malformed bytes are INVALID_ARGUMENT and an unknown session NOT_FOUND. Exit 0 when all hold.
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "proto")


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_protos(out):
    """protoc --python_out for both .proto files; returns (decode_pb2, health_pb2)."""
    subprocess.run(["protoc", "-I", PROTO, "--python_out", out, "fluxion/decode/v1/decode.proto",
                    "grpc/health/v1/health.proto"], check=True)
    # the generated health module lives under grpc/..., which would shadow grpcio: load by path
    return (load_module(os.path.join(out, "fluxion/decode/v1/decode_pb2.py"), "decode_pb2"),
            load_module(os.path.join(out, "grpc/health/v1/health_pb2.py"), "health_pb2"))


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

    with tempfile.TemporaryDirectory() as tmp:
        pb, hpb = compile_protos(tmp)
    ch = grpc.insecure_channel(a.target)
    svc = "/fluxion.decode.v1.DecodeNode/"

    def unary(method, req, resp_type, timeout=30):
        call = ch.unary_unary(svc + method, request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=resp_type.FromString)
        return call(req, timeout=timeout)

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
