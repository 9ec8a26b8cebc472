#!/usr/bin/python3
"""Cross-checks sluice's SigV4 signer (src/s3/sigv4.cc, through the sigv4_dump tool) against
botocore's S3SigV4Auth on a few hundred generated S3 requests.

    /usr/bin/python3 tests/integration/sigv4_botocore_test.py build/bin/sigv4_dump

Runs with Debian's python3 (python3-botocore); prints "SKIP: ..." and exits 77 (SKIP to ctest) without it.
The requests are generated from a fixed seed, so a failure reproduces. Each one is built the
way botocore's own S3 client builds it: the bucket percent-encoded with nothing kept, the key
percent-encoded with '/' and '~' kept (serialize.py, greedy "{Key+}" label), the query
encoded by prepare_request_dict (or, for some requests, handed to AWSRequest as params so the
signer encodes it), path-style on http://127.0.0.1:4568. botocore signs with the clock frozen
at the request's time; sigv4_dump signs the same description; the Authorization headers, the
other generated headers, the canonical requests, the wire path and the Content-MD5 must agree.
The last line printed is "N passed, M failed"; the exit status is non-zero on any failure.
"""

import base64
import contextlib
import datetime
import hashlib
import json
import random
import subprocess
import sys
from unittest import mock
from urllib.parse import urlsplit

try:
    import botocore
    import botocore.auth
    from botocore.awsrequest import AWSRequest, prepare_request_dict
    from botocore.config import Config
    from botocore.credentials import Credentials
    from botocore.utils import percent_encode
except ImportError:
    print("SKIP: python3-botocore not installed")
    sys.exit(77)  # ctest's SKIP_RETURN_CODE

SEED = 20240611
COUNT = 400
ENDPOINT = "http://127.0.0.1:4568"
HOST = "127.0.0.1:4568"
SIGV4_TIMESTAMP = "%Y%m%dT%H%M%SZ"

KEY_PIECES = [
    "a", "Z", "0", "9", "photos", "2024", "file.txt", ".tar.gz", "-", "_", "~", "~user",
    " ", "  ", "+", "=", "&", "%", "%2F", "%20", "/", "//", "///", ".", "..", "./", "../",
    "*", "!", "'", "(", ")", "$", "@", ":", ",", ";", "?", "#", "[", "]", "{", "}", "^", "`",
    "|", "\\", '"', "<", ">", "\t", "\x01", "\x7f",
    "\u00e9", "caf\u00e9", "\u043a\u043b\u044e\u0447", "\u65e5\u672c\u8a9e", "\U0001F642",
    "e\u0301", "\u00a0", "\ufeff", "\u2603",
]
PREFIX_PIECES = ["logs/", "2024/", "caf\u00e9/", "\u65e5\u672c/", "a b/", "x+y=", "%", "~", ""]
TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+="
BUCKETS = ["bucket", "my.bucket-1", "b", "sluice-test-0123456789"]
REGIONS = ["us-east-1", "eu-west-2", "ap-southeast-1", "auto"]


def random_key(rng):
    shape = rng.random()
    if shape < 0.05:
        return rng.choice(["", ".", "..", "/", "//", "/leading", "trailing/", "a//b", "~"])
    if shape < 0.12:  # very long: S3 allows 1024 bytes of UTF-8
        parts = []
        while len("".join(parts).encode()) < rng.randint(600, 1000):
            parts.append(rng.choice(KEY_PIECES + ["segment/", "longname"]))
        return "".join(parts)
    return "".join(rng.choice(KEY_PIECES) for _ in range(rng.randint(1, 12)))


def random_token(rng, n):
    return "".join(rng.choice(TOKEN_CHARS) for _ in range(n))


def random_case(rng, name):
    """The header name in a random mix of cases: signers must lower-case it."""
    r = rng.random()
    if r < 0.4:
        return name
    if r < 0.6:
        return name.lower()
    if r < 0.7:
        return name.upper()
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in name)


def random_body(rng, kind="bytes"):
    n = rng.choice([0, 1, 17, 1000, 65536 + 3])
    if kind == "xml":
        keys = "".join(f"<Object><Key>{i}</Key></Object>" for i in range(rng.randint(1, 5)))
        return f'<?xml version="1.0" encoding="UTF-8"?><Delete>{keys}</Delete>'.encode()
    return rng.randbytes(n)


def content_md5(body):
    return base64.b64encode(hashlib.md5(body).digest()).decode()


def make_case(rng, i):
    """One request: method, bucket, key (None for bucket-level), query, headers, body."""
    op = rng.choice([
        "get_object", "get_object", "head_object", "put_object", "put_object", "delete_object",
        "list_objects_v2", "create_multipart", "upload_part", "complete_multipart",
        "abort_multipart", "list_uploads", "delete_objects", "odd_query",
    ])
    bucket = rng.choice(BUCKETS)
    key = random_key(rng)
    query, headers, body = [], [], b""
    upload_id = random_token(rng, rng.randint(20, 80))

    if op == "get_object":
        method = "GET"
        r = rng.random()
        if r < 0.3:
            headers.append(("Range", "bytes=0-107374182399"))
        elif r < 0.5:
            start = rng.randint(0, 1 << 40)
            headers.append(("Range", f"bytes={start}-{start + rng.randint(0, 1 << 30)}"))
        elif r < 0.6:
            headers.append(("Range", rng.choice(["bytes=-500", "bytes=100-", "bytes=0-9"])))
        if rng.random() < 0.3:
            headers.append(("If-Match", '"' + hashlib.md5(key.encode()).hexdigest() + '"'))
        if rng.random() < 0.2:
            headers.append(("If-None-Match", rng.choice(["*", '"abc"'])))
        if rng.random() < 0.2:
            query.append(("versionId", random_token(rng, 32)))
        if rng.random() < 0.1:
            query.append(("partNumber", str(rng.randint(1, 10000))))
    elif op == "head_object":
        method = "HEAD"
        if rng.random() < 0.4:
            headers.append(("If-Match", '"' + hashlib.md5(key.encode()).hexdigest() + '-3"'))
    elif op == "put_object":
        method = "PUT"
        body = random_body(rng)
        if rng.random() < 0.5:
            headers.append(("Content-MD5", content_md5(body)))
        if rng.random() < 0.4:
            # Any 4-byte value: only its signing matters here.
            headers.append(("x-amz-checksum-crc32c", base64.b64encode(rng.randbytes(4)).decode()))
        if rng.random() < 0.3:
            headers.append(("Content-Type", rng.choice(
                ["application/octet-stream", "text/plain;  charset=utf-8", " text/html "])))
        if rng.random() < 0.3:
            headers.append(("If-None-Match", "*"))
    elif op == "delete_object":
        method = "DELETE"
        if rng.random() < 0.3:
            query.append(("versionId", random_token(rng, 32)))
    elif op == "list_objects_v2":
        method, key = "GET", None
        query.append(("list-type", "2"))
        if rng.random() < 0.7:
            query.append(("prefix", "".join(rng.choice(PREFIX_PIECES) for _ in range(3))))
        if rng.random() < 0.5:
            query.append(("delimiter", "/"))
        if rng.random() < 0.4:
            query.append(("continuation-token", random_token(rng, rng.randint(10, 200))))
        if rng.random() < 0.3:
            query.append(("start-after", random_key(rng)))
        if rng.random() < 0.3:
            query.append(("max-keys", str(rng.randint(0, 1000))))
        if rng.random() < 0.2:
            query.append(("encoding-type", "url"))
        if rng.random() < 0.2:
            query.append(("fetch-owner", "true"))
        rng.shuffle(query)
    elif op == "create_multipart":
        method = "POST"
        query.append(("uploads", ""))
    elif op == "upload_part":
        method = "PUT"
        query += [("partNumber", str(rng.randint(1, 10000))), ("uploadId", upload_id)]
        rng.shuffle(query)
        body = random_body(rng)
        if rng.random() < 0.5:
            headers.append(("Content-MD5", content_md5(body)))
    elif op == "complete_multipart":
        method = "POST"
        query.append(("uploadId", upload_id))
        body = random_body(rng, "xml")
    elif op == "abort_multipart":
        method = "DELETE"
        query.append(("uploadId", upload_id))
    elif op == "list_uploads":
        method, key = "GET", None
        query.append(("uploads", ""))
        if rng.random() < 0.5:
            query.append(("prefix", random_key(rng)))
        if rng.random() < 0.3:
            query.append(("upload-id-marker", upload_id))
    elif op == "delete_objects":
        method, key = "POST", None
        query.append(("delete", ""))
        body = random_body(rng, "xml")
        headers.append(("Content-MD5", content_md5(body)))
    else:  # odd_query: names that sort differently as pairs and as "name=value" strings,
        # repeated names, and names and values from the odd-key alphabet.
        method = rng.choice(["GET", "PUT", "HEAD", "POST", "DELETE"])
        for _ in range(rng.randint(1, 6)):
            name = rng.choice(["a", "a-b", "a.b", "a_b", "A", "Z", "~x", "x y", "k", "k",
                               "\u00e9", "=", "&"])
            query.append((name, rng.choice(["", "1", "+", " ", "/", "~", "a=b&c", random_key(rng)])))
        if method in ("PUT", "POST"):
            body = random_body(rng)

    # User metadata with messy white space and mixed-case, sometimes repeated, names.
    if rng.random() < 0.25:
        headers.append(("x-amz-meta-note", rng.choice(
            ["  leading", "trailing  ", "inner   run", "tab\tinside", " \t mixed \t  all \t", "",
             "   ", "a,b", "q\"uote"])))
    if rng.random() < 0.1:
        headers.append(("X-Amz-Meta-Dup", "first"))
        headers.append(("x-amz-meta-dup", "second  value"))
    headers = [(random_case(rng, n), v) for n, v in headers]
    rng.shuffle(headers)

    return {
        "index": i,
        "op": op,
        "method": method,
        "bucket": bucket,
        "key": key,
        "query": query,
        "headers": headers,
        "body": body,
        "unsigned": rng.random() < 0.2,
        "query_mode": "params" if rng.random() < 0.3 else "url",
        "access_key": "AKIA" + "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
                                       for _ in range(16)),
        "secret_key": random_token(rng, 40),
        "session_token": random_token(rng, rng.randint(100, 400)) if rng.random() < 0.5 else "",
        "region": rng.choice(REGIONS),
        "time": rng.randint(946684800, 4102444799),  # 2000 .. 2099
    }


class CapturingS3SigV4Auth(botocore.auth.S3SigV4Auth):
    """S3SigV4Auth that keeps the canonical request and string to sign it computed."""

    def canonical_request(self, request):
        self.last_canonical_request = super().canonical_request(request)
        return self.last_canonical_request

    def string_to_sign(self, request, canonical_request):
        self.last_string_to_sign = super().string_to_sign(request, canonical_request)
        return self.last_string_to_sign


def frozen_datetime_module(when):
    """A stand-in for the `datetime` module botocore.auth imported, whose clock reads `when`.
    botocore 1.29 (Debian 12) calls datetime.datetime.utcnow() in SigV4Auth.add_auth."""

    class FrozenDatetime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return when

        @classmethod
        def now(cls, tz=None):
            return when.replace(tzinfo=tz) if tz is not None else when

    return type("frozen_datetime", (), {"datetime": FrozenDatetime, "timezone": datetime.timezone})


@contextlib.contextmanager
def frozen_clock(when):
    """Freezes botocore's signing clock at `when` (a naive UTC datetime)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.object(botocore.auth, "datetime", frozen_datetime_module(when)))
        # Newer botocore (1.3x+) reads the clock through compat.get_current_datetime instead.
        if hasattr(botocore.auth, "get_current_datetime"):
            stack.enter_context(mock.patch.object(
                botocore.auth, "get_current_datetime", lambda remove_tzinfo=True: when))
        yield


def sign_with_botocore(case):
    url_path = "/" + percent_encode(case["bucket"], safe="")
    if case["key"] is not None:
        url_path += "/" + percent_encode(case["key"], safe="/~")
    if case["query_mode"] == "url":
        request_dict = {"url_path": url_path, "query_string": list(case["query"]),
                        "method": case["method"], "headers": {}, "body": case["body"]}
        prepare_request_dict(request_dict, ENDPOINT)
        request = AWSRequest(method=case["method"], url=request_dict["url"], data=case["body"])
    else:
        request = AWSRequest(method=case["method"], url=ENDPOINT + url_path, data=case["body"],
                             params=list(case["query"]))
    for name, value in case["headers"]:
        request.headers[name] = value  # an email.message.Message: repeated names accumulate
    if case["unsigned"]:
        request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    creds = Credentials(case["access_key"], case["secret_key"], case["session_token"] or None)
    auth = CapturingS3SigV4Auth(creds, "s3", case["region"])
    when = datetime.datetime.utcfromtimestamp(case["time"])
    with frozen_clock(when):
        auth.add_auth(request)
    return request, auth


def dump_input(case):
    line = {
        "method": case["method"], "host": HOST, "bucket": case["bucket"],
        "query": [list(p) for p in case["query"]],
        "headers": [list(h) for h in case["headers"]],
        "body_b64": base64.b64encode(case["body"]).decode(),
        "access_key": case["access_key"], "secret_key": case["secret_key"],
        "session_token": case["session_token"], "region": case["region"], "service": "s3",
        "time": case["time"],
    }
    if case["key"] is not None:
        line["key"] = case["key"]
    if case["unsigned"]:
        line["payload_sha256"] = "UNSIGNED-PAYLOAD"
    return json.dumps(line)


def compare(case, request, auth, out):
    problems = []
    if "error" in out:
        return [f"sigv4_dump rejected the request: {out['error']}"]
    ours = dict(out["headers"])
    if request.headers["Authorization"] != out["authorization"]:
        problems.append("Authorization differs:\n  botocore: %s\n  sluice:   %s"
                        % (request.headers["Authorization"], out["authorization"]))
    expected_date = datetime.datetime.utcfromtimestamp(case["time"]).strftime(SIGV4_TIMESTAMP)
    if request.headers["X-Amz-Date"] != expected_date:
        problems.append(f"botocore's clock was not frozen: {request.headers['X-Amz-Date']}")
    for name in ("X-Amz-Date", "X-Amz-Content-SHA256", "X-Amz-Security-Token"):
        theirs = request.headers.get(name)
        mine = ours.get(name.lower())
        if theirs != mine:
            problems.append(f"{name} differs: botocore {theirs!r}, sluice {mine!r}")
    if auth.last_canonical_request != out["canonical_request"]:
        problems.append("canonical requests differ")
    if auth.last_string_to_sign != out["string_to_sign"]:
        problems.append("strings to sign differ")
    if urlsplit(request.url).path != out["path"]:
        problems.append(f"wire path differs: botocore {urlsplit(request.url).path!r}, "
                        f"sluice {out['path']!r}")
    if case["query_mode"] == "url":
        wire = urlsplit(request.url).query
        # botocore sends the query in the order given; sluice sends it sorted. Same pairs.
        if sorted(p.partition("=") for p in wire.split("&") if wire) != sorted(
                p.partition("=") for p in out["query_string"].split("&") if out["query_string"]):
            problems.append(f"query pairs differ: botocore {wire!r}, sluice "
                            f"{out['query_string']!r}")
    if out["content_md5"] != content_md5(case["body"]):
        problems.append(f"Content-MD5 differs: {content_md5(case['body'])} vs "
                        f"{out['content_md5']}")
    if problems:
        problems.append("botocore canonical request:\n" + auth.last_canonical_request)
        problems.append("sluice canonical request:\n" + out["canonical_request"])
        problems.append("botocore string to sign:\n" + auth.last_string_to_sign)
        problems.append("sluice string to sign:\n" + out["string_to_sign"])
    return problems


def main():
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} PATH/TO/sigv4_dump", file=sys.stderr)
        return 2
    rng = random.Random(SEED)
    cases = [make_case(rng, i) for i in range(COUNT)]
    signed = [sign_with_botocore(c) for c in cases]

    proc = subprocess.run([sys.argv[1]], input="".join(dump_input(c) + "\n" for c in cases),
                          capture_output=True, text=True, timeout=120)
    outputs = [json.loads(line) for line in proc.stdout.splitlines() if line]
    if len(outputs) != len(cases):
        print(f"sigv4_dump printed {len(outputs)} lines for {len(cases)} requests "
              f"(exit {proc.returncode}): {proc.stderr}")
        print(f"0 passed, {len(cases)} failed")
        return 1

    passed = failed = 0
    for case, (request, auth), out in zip(cases, signed, outputs):
        problems = compare(case, request, auth, out)
        if problems:
            failed += 1
            print(f"FAIL #{case['index']} {case['op']} {case['method']} bucket={case['bucket']!r} "
                  f"key={case['key']!r} query={case['query']!r} headers={case['headers']!r} "
                  f"unsigned={case['unsigned']} query_mode={case['query_mode']} "
                  f"token={'yes' if case['session_token'] else 'no'}")
            for p in problems:
                print("  " + p.replace("\n", "\n    "))
        else:
            passed += 1
    if proc.returncode != 0 and failed == 0:
        print(f"sigv4_dump exited {proc.returncode}: {proc.stderr}")
        failed += 1
    ops = sorted({c["op"] for c in cases})
    print(f"botocore {botocore.__version__}; seed {SEED}; operations: {', '.join(ops)}; "
          f"{sum(1 for c in cases if c['session_token'])} with a session token, "
          f"{sum(1 for c in cases if c['unsigned'])} UNSIGNED-PAYLOAD, "
          f"{sum(1 for c in cases if c['query_mode'] == 'params')} with botocore encoding params")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
