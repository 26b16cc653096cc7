"""No URL's credentials in what collio shows, and zarr creation options ranks compare alike.

The S3 and zarr backends under mpiexec are tested in ``mpi_tests/test_hardening.py`` and
``mpi_tests/test_zarr.py``; these are the pure parts, and the one fact that needs fresh
processes (hash seeds).
"""

from __future__ import annotations

import pytest

import collio
from collio.backends.s3.options import S3Options
from collio.backends.s3.plan import parse_target
from collio.bench.main import _shown
from collio.collective import detached
from collio.errors import classify, scrubbed
from collio.redact import redact_text, redact_url, shown
from collio.testing.jobs import python

PW = "S3CRETpw"
# (URL, what is shown): the user info is everything up to the last '@'
URLS = [
    (f"http://user:{PW}@host:9000", "http://***@host:9000"),
    (f"http://AKIAX:{PW}/abc+d@host:9000", "http://***@host:9000"),  # '/' in an AWS key
    (f"http://user:{PW}@x@host:9000/p", "http://***@host:9000/p"),
    (f"http://user:{PW}%2Fq@host", "http://***@host"),
    (f"http://user:{PW}?x#y@host/p", "http://***@host/p"),
    (f"htp:/u:{PW}@bad url", "htp:***@bad url"),  # no '//': no netloc for urllib
    (f"s3://AKIAKEY:{PW}@bkt/a.zarr", "s3://***@bkt/a.zarr"),
    (f"http://{PW}@host/a.zarr", "http://***@host/a.zarr"),  # a token alone
]


@pytest.mark.parametrize(("url", "want"), URLS)
def test_redact_url_hides_all_user_info(url, want):
    assert redact_url(url) == want
    assert PW not in shown(url) and "***@" in shown(url)


@pytest.mark.parametrize("url", ["http://host:9000/p", "/data/x@y", "run@3.zarr", "mem://a"])
def test_urls_without_user_info_and_paths_stay(url):
    assert redact_url(url) == url
    assert redact_text(f"at {url}: failed", url) == f"at {url}: failed"


@pytest.mark.parametrize(("url", "_"), URLS)
def test_texts_quoting_a_url_or_its_pieces(url, _):
    """Libraries quote a URL whole, in quotes or backticks, or a piece of it (s3fs takes
    ``KEY:SECRET@bkt`` for the bucket name; a decoded password)."""
    texts = [
        f"Custom endpoint `{url}` was not a valid URI",
        f"Invalid endpoint: {url}",
        f"Could not connect to the endpoint URL: {url + '/bkt/k?uploads'!r}",
        f'Invalid bucket name "{url.split("//")[-1].split("/")[0]}": must match',
        f"password {PW} refused",
    ]
    for text in texts:
        assert PW not in redact_text(text, url), text


def test_unknown_urls_in_a_text_lose_their_user_info():
    text = f"Custom endpoint `http://AKIAX:{PW}/abc+d@127.0.0.1:1` was not a valid URI"
    assert redact_text(text) == "Custom endpoint `http://***@127.0.0.1:1` was not a valid URI"
    assert PW not in classify(ValueError(text))[1]


def test_s3_options_repr_and_bench_options():
    for url, want in URLS:
        assert f"endpoint_url={want!r}" in repr(S3Options(endpoint_url=url))
        assert _shown({"endpoint": url})["endpoint"] == want


def test_s3_target_with_user_info_is_not_quoted():
    with pytest.raises(collio.BackendError) as info:
        parse_target(f"s3://AKIA:{PW}@bkt/key")
    assert PW not in str(info.value) and "s3://***@bkt/key" in str(info.value)


def test_an_error_about_a_url_with_credentials_keeps_none_in_its_chain():
    url = f"http://AKIAX:{PW}/abc+d@127.0.0.1:1"
    try:
        try:
            raise KeyError(f"endpoint {url.replace('http://', '')} unknown")
        except KeyError as exc:
            raise collio.BackendError(f"open: {redact_url(url)}") from exc
    except collio.BackendError as exc:
        raised = exc
    err = scrubbed(raised, url)
    assert err is not None and err.__cause__ is None and err.__suppress_context__
    assert PW not in str(err) and type(err) is collio.BackendError
    assert scrubbed(raised, "http://host:1") is raised  # nothing to hide: kept as it is
    # a chain that quotes an unknown URL whole: agreed errors are raised from it
    top = collio.BackendError("write failed")
    top.__cause__ = OSError(f"could not reach {url}")
    chained = detached(top)
    assert chained is top and PW not in str(top.__cause__) and "***@127.0.0.1" in str(top.__cause__)


_IDENTITY = """
import zarr
from collio.backends.zarr.spec import OpenSpec
codec = zarr.codecs.BloscCodec(cname="zstd", clevel=3)
spec = OpenSpec.parse("/x.zarr", "w", dict(shape=(8,), dtype="f8", compressors=codec,
                      filters=[zarr.codecs.TransposeCodec(order=(0,))]), nranks=4)
print(spec.identity())
"""


def test_zarr_creation_options_compare_alike_whatever_the_hash_seed():
    """A codec's repr may hold a set (BloscCodec's tunable attributes): ranks, each with
    its own hash seed, compare the codec's own form."""
    pytest.importorskip("zarr")
    seen = set()
    for seed in range(6):  # (each fixed: with the repr, 0 and 1 already differ)
        out = python(_IDENTITY, env={"PYTHONHASHSEED": str(seed)})
        assert out.returncode == 0, out.stderr
        seen.add(out.stdout)
    assert len(seen) == 1, seen


def test_zarr_none_options_are_passed_on():
    pytest.importorskip("zarr")
    from collio.backends.zarr.spec import OpenSpec

    opts = dict(shape=(8,), dtype="i4", compressors=None, filters=None, fill_value=None)
    spec = OpenSpec.parse("/x.zarr", "w", {**opts, "chunks": None}, nranks=1)
    assert spec.create_options == opts
    with pytest.raises(collio.ModeError, match="'fsync'"):
        OpenSpec.parse("/x.zarr", "w", {**opts, "fsinc": True}, nranks=1)
