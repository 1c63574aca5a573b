#!/usr/bin/python3
"""fluxion_client.py - a router's side of fluxion-decoded, with nothing but Debian's python3-grpcio
and python3-protobuf (run it with /usr/bin/python3).

The .proto files are compiled with protoc into a temporary folder at start (nothing generated is
committed) and the calls are plain channel.unary_unary / unary_stream with the messages'
serializers: no gRPC stubs, so the snippet is easy to lift into a router.

  fluxion_client.py --target HOST:PORT status
  fluxion_client.py --target HOST:PORT generate --session ID [--max-new N] [--ids-out FILE]
                    [--summary-out FILE] [--quiet]

generate: WaitReady on the session (its KV arrives over UCX from a prefill node, e.g.
`flx-prefill --control`), then Generate: the answer's text is streamed to stdout as it comes, then
one summary block: the transfer (bytes, time to READY, GB/s first to last byte), TTFT, TPOT, host
bytes read per step and Fluxion's statistics. Exit 0 when the stream ended normally, 1 with the
gRPC status otherwise.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
SVC = "/fluxion.decode.v1.DecodeNode/"


def proto_dir():
    """The repository's proto/ (or an installed share/fluxion/proto next to bin/)."""
    for d in (os.path.join(HERE, "..", "proto"), os.path.join(HERE, "..", "share", "fluxion", "proto")):
        if os.path.exists(os.path.join(d, "fluxion", "decode", "v1", "decode.proto")):
            return d
    sys.exit("fluxion_client.py: cannot find proto/fluxion/decode/v1/decode.proto")


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compile_protos(proto=None):
    """protoc --python_out for both .proto files; returns (decode_pb2, health_pb2)."""
    proto = proto or proto_dir()
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["protoc", "-I", proto, "--python_out", out, "fluxion/decode/v1/decode.proto",
                        "grpc/health/v1/health.proto"], check=True)
        # the generated health module lives under grpc/..., which would shadow grpcio: load by path
        return (_load(os.path.join(out, "fluxion/decode/v1/decode_pb2.py"), "decode_pb2"),
                _load(os.path.join(out, "grpc/health/v1/health_pb2.py"), "health_pb2"))


class Node:
    """DecodeNode's calls on one channel."""

    def __init__(self, target, pb):
        self.pb = pb
        self.ch = grpc.insecure_channel(target)

    def unary(self, method, req, resp_type, timeout=30):
        call = self.ch.unary_unary(SVC + method, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=resp_type.FromString)
        return call(req, timeout=timeout)

    def generate(self, req, timeout=600):
        call = self.ch.unary_stream(SVC + "Generate", request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=self.pb.GenerateResponse.FromString)
        return call(req, timeout=timeout)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else 0.0


def cmd_generate(node, a):
    pb = node.pb
    info = node.unary("WaitReady", pb.WaitReadyRequest(session_id=a.session, timeout_ms=a.wait_ms), pb.SessionInfo,
                      timeout=a.wait_ms / 1000 + 10)
    if info.state != pb.SESSION_STATE_READY:
        why = info.fail_reason or {
            pb.SESSION_STATE_DECODING: "another Generate has claimed it",
            pb.SESSION_STATE_CLOSED: "it was closed",
        }.get(info.state, "not READY after --wait-ms %d" % a.wait_ms)
        print("fluxion_client.py: session %d is %s: %s" % (a.session, pb.SessionState.Name(info.state), why),
              file=sys.stderr)
        return 1
    req = pb.GenerateRequest(session_id=a.session, stop=pb.StopConditions(max_new_tokens=a.max_new))
    ids, intervals, steps, host, heads, streaming, groups, skipped = [], [], [], [], 0, 0, 0, 0
    by_blk = [0, 0, 0, 0]
    finish = 0
    try:
        for m in node.generate(req):
            ids.append(m.token_id)
            intervals.append(m.timing.interval_us / 1e3)
            if m.index > 0:
                steps.append(m.timing.step_us / 1e3)
                host.append(m.stats.host_bytes)
                heads += m.stats.heads
                streaming += m.stats.streaming_heads
                groups += m.stats.groups
                skipped += m.stats.skipped_groups
                for j, g in enumerate(m.stats.groups_by_blk[:4]):
                    by_blk[j] += g
            finish = m.finish_reason
            if not a.quiet:
                sys.stdout.write(m.text)
                sys.stdout.flush()
    except grpc.RpcError as e:
        print("\nfluxion_client.py: Generate ended %s: %s" % (e.code().name, e.details()), file=sys.stderr)
        return 1
    if not a.quiet:
        sys.stdout.write("\n")
    s = {
        "session": a.session, "mode": pb.AttentionMode.Name(info.attention.mode),
        "prompt_len": info.prompt_len, "transfer_bytes": info.bytes_received,
        "time_to_ready_ms": info.time_to_ready_us / 1e3, "transfer_gbps": info.transfer_gbps,
        "tokens": len(ids), "finish": pb.FinishReason.Name(finish),
        "ttft_ms": intervals[0] if intervals else 0.0,
        "first_decoded_ms": sum(intervals[:2]) if len(intervals) > 1 else 0.0,
        "tpot_ms_mean": statistics.mean(intervals[1:]) if len(intervals) > 1 else 0.0,
        "tpot_ms_p50": pct(intervals[1:], 0.5), "tpot_ms_p90": pct(intervals[1:], 0.9),
        "step_ms_mean": statistics.mean(steps) if steps else 0.0,
        "host_bytes_per_step": statistics.mean(host) if host else 0.0,
        "streaming_heads": streaming, "heads": heads, "skipped_groups": skipped, "groups": groups,
        "host_tasks_by_blk": dict(zip(("16", "32", "64", "128"), by_blk)),
    }
    print("  transfer: %d KV bytes over UCX, READY %.0f ms after OpenSession, %.2f GB/s first to last byte"
          % (s["transfer_bytes"], s["time_to_ready_ms"], s["transfer_gbps"]))
    print("  decode (%s): %d tokens (%s), TTFT %.1f ms after READY (the prefill node's token; the first decoded "
          "one at %.1f ms), TPOT mean %.1f / p50 %.1f / p90 %.1f ms, host KV read %.2f MB/step"
          % (s["mode"], s["tokens"], s["finish"], s["ttft_ms"], s["first_decoded_ms"], s["tpot_ms_mean"],
             s["tpot_ms_p50"], s["tpot_ms_p90"], s["host_bytes_per_step"] / 1e6))
    if info.attention.mode == pb.ATTENTION_MODE_FLUXION and heads:
        print("  fluxion: streaming heads %.1f%% (%d of %d), groups reading nothing on the host %.1f%%, "
              "host tasks by blk 16/32/64/128: %s" % (100.0 * streaming / heads, streaming, heads,
                                                     100.0 * skipped / max(groups, 1), "/".join(map(str, by_blk))))
    if a.ids_out:
        with open(a.ids_out, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
    if a.summary_out:
        with open(a.summary_out, "w") as f:
            json.dump(s, f)
    return 0


def cmd_status(node, a):
    st = node.unary("NodeStatus", node.pb.NodeStatusRequest(), node.pb.NodeStatusResponse)
    print(st)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the node's gRPC HOST:PORT")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--session", type=int, required=True)
    g.add_argument("--max-new", type=int, default=64)
    g.add_argument("--wait-ms", type=int, default=60000, help="WaitReady's timeout")
    g.add_argument("--ids-out", help="write the token ids here")
    g.add_argument("--summary-out", help="write the summary as JSON here")
    g.add_argument("--quiet", action="store_true", help="no text, only the summary")
    sub.add_parser("status")
    a = ap.parse_args()
    pb, _ = compile_protos()
    node = Node(a.target, pb)
    try:
        return cmd_generate(node, a) if a.cmd == "generate" else cmd_status(node, a)
    except grpc.RpcError as e:
        print("fluxion_client.py: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
