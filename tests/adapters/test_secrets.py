"""Secrets backends: explicit mappings only, mounted-directory layouts, values never leak."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest

from suaveplan_sandbox.adapters._audit import JsonLinesAudit
from suaveplan_sandbox.adapters._protocols import AuditRecord
from suaveplan_sandbox.adapters._secrets import DirectorySecrets, EnvSecrets, StaticSecrets
from suaveplan_sandbox.errors import SuaveplanError

VALUE = "s3cr3t-VALUE-42"


async def test_env_secrets_read_only_the_mapped_variables() -> None:
    env = {"API_TOKEN": VALUE, "HOME": "/root"}
    secrets = EnvSecrets({"token": "API_TOKEN"}, environ=env)
    assert await secrets.get("token") == VALUE
    for name in ("HOME", "API_TOKEN", "missing"):
        with pytest.raises(SuaveplanError) as info:
            await secrets.get(name)
        assert info.value.code == "SAND_SECRET_UNAVAILABLE"


async def test_env_secrets_default_to_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUAVEPLAN_TEST_SECRET", VALUE)
    assert await EnvSecrets({"t": "SUAVEPLAN_TEST_SECRET"}).get("t") == VALUE


async def test_static_secrets_return_values_and_refuse_unknown_names() -> None:
    secrets = StaticSecrets({"token": VALUE})
    assert await secrets.get("token") == VALUE
    with pytest.raises(SuaveplanError) as info:
        await secrets.get("other")
    assert info.value.code == "SAND_SECRET_UNAVAILABLE"


def _kubernetes_mount(path: Path) -> None:
    stamp = path / "..2026_12_03_00_00_00.1"
    stamp.mkdir(parents=True)
    (stamp / "token").write_text(VALUE + "\n")
    (path / "..data").symlink_to(stamp.name)
    (path / "token").symlink_to("..data/token")


async def test_directory_secrets_read_docker_and_kubernetes_layouts(tmp_path: Path) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "token").write_text(VALUE)
    assert await DirectorySecrets(docker).get("token") == VALUE
    kube = tmp_path / "kube"
    _kubernetes_mount(kube)
    assert await DirectorySecrets(kube).get("token") == VALUE


async def test_directory_secrets_refuse_links_out_and_odd_names(tmp_path: Path) -> None:
    mount = tmp_path / "m"
    mount.mkdir()
    (tmp_path / "outside").write_text(VALUE)
    (mount / "evil").symlink_to(tmp_path / "outside")
    (mount / "..data").symlink_to("..")
    (mount / "evil2").symlink_to("..data/outside")
    secrets = DirectorySecrets(mount)
    for name in ("evil", "evil2", "../outside", ".hidden", "", "missing", "..data"):
        with pytest.raises(SuaveplanError) as info:
            await secrets.get(name)
        assert info.value.code == "SAND_SECRET_UNAVAILABLE"


async def test_secret_values_never_reach_repr_errors_logs_or_audit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SUAVEPLAN_TEST_SECRET", VALUE)
    kube = tmp_path / "kube"
    _kubernetes_mount(kube)
    backends: list[EnvSecrets | StaticSecrets | DirectorySecrets] = [
        EnvSecrets({"token": "SUAVEPLAN_TEST_SECRET"}),
        StaticSecrets({"token": VALUE}),
        DirectorySecrets(kube),
    ]
    texts: list[str] = []
    for backend in backends:
        assert await backend.get("token") == VALUE
        texts.append(repr(backend))
        texts.append(str(backend))
        with pytest.raises(SuaveplanError) as info:
            await backend.get("nope")
        texts.append(str(info.value))
        texts.append(repr(info.value))
        texts.append("".join(traceback.format_exception(info.value)))
        texts.append(repr(info.value.to_wire()))
    audit = JsonLinesAudit(logging.getLogger("suaveplan_sandbox.audit"), include_resource=True)
    audit.record(
        AuditRecord(
            plugin="p",
            capability="secrets",
            operation="get",
            allowed=True,
            reason=None,
            rule="token",
            duration_ms=0.1,
            resource="token",
        )
    )
    texts.append(caplog.text)
    assert "token" in caplog.text
    for text in texts:
        assert VALUE not in text


async def test_secret_values_stay_out_of_every_gateway_output_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the gateway: the guest gets the value; audit, metrics, logs and errors do not."""
    from suaveplan_sandbox.adapters import Adapters
    from suaveplan_sandbox.gateway import Gateway
    from suaveplan_sandbox.metrics import InMemoryMetrics
    from suaveplan_sandbox.permissions import PermissionChecker, PermissionPolicy

    caplog.set_level(logging.DEBUG)
    mount = tmp_path / "mount"
    mount.mkdir()
    (mount / "token").write_text(VALUE)
    (mount / "big").write_text(VALUE * 10_000)  # over the 64 KiB cap
    (mount / "binary").write_bytes(VALUE.encode() + b"\xff\xfe")
    policy = PermissionPolicy.from_manifest(
        {"name": "red", "secrets": [{"name": "token"}, {"name": "big"}, {"name": "binary"}]},
        root=tmp_path,
    )
    metrics = InMemoryMetrics()
    audit = JsonLinesAudit(logging.getLogger("suaveplan_sandbox.audit"), include_resource=True)
    gateway = Gateway(
        checker=PermissionChecker(policy, metrics=metrics),
        adapters=Adapters(secrets=DirectorySecrets(mount)),
        audit=audit,
    )
    assert await gateway.dispatch("secrets", "get", {"name": "token"}) == VALUE
    texts: list[str] = []
    for name in ("big", "binary", "undeclared"):
        with pytest.raises(SuaveplanError) as info:
            await gateway.dispatch("secrets", "get", {"name": name})
        assert info.value.code in {"SAND_SECRET_UNAVAILABLE", "SAND_PERM_DENIED"}
        texts += [
            str(info.value),
            repr(info.value.to_wire()),
            "".join(traceback.format_exception(info.value)),
        ]
    await gateway.close()
    texts += [caplog.text, repr(metrics.samples()), repr(gateway), repr(audit)]
    assert '"resource":"token"' in caplog.text  # the audit line exists, with the name only
    for text in texts:
        assert VALUE not in text


async def test_an_undecodable_secret_file_leaves_no_trace_of_its_bytes_on_the_error(
    tmp_path: Path,
) -> None:
    # The UnicodeDecodeError holds the raw bytes; `from None` only hides it from tracebacks,
    # so it must not be the error's context either.
    (tmp_path / "binary").write_bytes(VALUE.encode() + b"\xff\xfe")
    with pytest.raises(SuaveplanError) as info:
        await DirectorySecrets(tmp_path).get("binary")
    chain: list[BaseException] = []
    link: BaseException | None = info.value
    while link is not None and len(chain) < 10:
        chain.append(link)
        link = link.__cause__ or link.__context__
    assert [type(e) for e in chain] == [SuaveplanError]
    for item in chain:
        assert VALUE not in repr(item)
        assert VALUE not in repr(vars(item))
