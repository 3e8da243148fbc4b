"""Identity and access with real heads, real HTTP(S) and the real CLI."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import pwd
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpucluster import userconfig
from gpucluster.client import Client
from gpucluster.models import Job

from .headproc import HeadProcess, cli, free_port, passable_dir, wait_for

CLI = [sys.executable, "-m", "gpucluster.cli.main"]


@pytest.fixture(scope="module")
def head() -> Iterator[HeadProcess]:
    with passable_dir("gc-auth-") as root:  # jobs run as `nobody` reach their own directory
        h = HeadProcess(root / "data", gpus=4)
        try:
            yield h.start()
        finally:
            h.stop()
            h.kill_jobs()


def ended(c: Client, job_id: int) -> Job:
    return wait_for(lambda: (j := c.job(job_id)).state.terminal and j, timeout=30, what=f"job {job_id} to end")


def test_the_first_up_writes_its_admin_token_privately_and_the_cli_just_works(head: HeadProcess) -> None:
    path = userconfig.config_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and head.token and head.token in path.read_text()
    r = cli(head, "whoami", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cluster_admin"] is True
    assert httpx.get(f"{head.url}/v1/jobs").status_code == 401
    assert httpx.get(f"{head.url}/v1/health").status_code == 200  # probes need no token


def test_members_submit_to_their_team_and_see_only_its_jobs(head: HeadProcess) -> None:
    r = cli(
        head, "admin", "add-user", "alice", "--team", "vision", "--unix-user", pwd.getpwuid(os.geteuid())[0], "--json"
    )
    assert r.returncode == 0, r.stderr
    alice = json.loads(r.stdout)["token"]
    r = cli(head, "admin", "add-user", "bob", "--team", "nlp", "--json")
    assert r.returncode == 0, r.stderr
    bob = json.loads(r.stdout)["token"]

    r = cli(head, "--token", alice, "submit", "--name", "alice-secret", "--json", "--", "echo", "hello")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["spec"]["team"] == "vision" and job["owner"] == "alice"
    with head.client() as admin:
        assert ended(admin, job["id"]).state.value == "succeeded"

    r = cli(head, "submit", "--team", "vision", "--", "true", token=bob)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "you (bob) are not a member of team 'vision'; your teams: nlp" in r.stderr
    r = cli(head, "jobs", token=bob)
    assert r.returncode == 0 and "alice-secret" not in r.stdout
    r = cli(head, "logs", str(job["id"]), token=bob)
    assert r.returncode == 1 and r.stderr == f"error: no job with id {job['id']}\n"  # another team's: as if missing
    assert cli(head, "logs", str(job["id"]), token=alice).stdout == "hello\n"

    tokens = json.loads(cli(head, "admin", "tokens", "--user", "alice", "--json").stdout)
    assert cli(head, "admin", "revoke", str(tokens[0]["id"])).returncode == 0
    r = cli(head, "jobs", token=alice)
    assert r.returncode == 1 and f"token {tokens[0]['id']} was revoked" in r.stderr
    r = cli(head, "admin", "users", token=bob)
    assert r.returncode == 1 and "for cluster admins" in r.stderr

    audit = json.loads(cli(head, "admin", "audit", "--json").stdout)
    with head.client() as c:
        me = c.whoami().user
    assert {("alice", "submit"), (me, "add-user"), (me, "revoke")} <= {(e["user"], e["action"]) for e in audit}


def test_a_job_reports_progress_with_its_own_token(head: HeadProcess) -> None:
    code = (
        "from gpucluster.train.progress import ProgressReporter; r = ProgressReporter(min_interval_s=0); "
        "r.report(7); r.close(5); print('sent', r.sent, 'failed', r.failed)"
    )
    with head.client() as c:
        job = c.submit([sys.executable, "-c", code], workdir=str(head.data_dir))
        assert ended(c, job.id).state.value == "succeeded"
        assert c.logs(job.id).strip() == "sent 1 failed 0"
        progress = c.job(job.id).progress
        assert progress is not None and progress.step == 7


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root head runs jobs as other accounts")
def test_a_root_head_runs_a_job_as_its_submitters_unix_account(head: HeadProcess) -> None:
    with head.client() as admin:
        new = admin.add_user("nob", ["t"], unix_user="nobody")
    with Client(head.url, token=new.token) as c:
        job = c.submit(["id", "-un"], workdir="/tmp")
        assert ended(c, job.id).state.value == "succeeded"
        assert c.logs(job.id) == "nobody\n"
        assert c.whoami().runs_jobs_as == "nobody"


def test_up_refuses_a_network_address_without_tls(tmp_path: Path) -> None:
    r = subprocess.run(
        [*CLI, "up", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "refusing to listen on 0.0.0.0 over plain HTTP" in r.stderr and "--tls-cert" in r.stderr


def self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls(head_factory: type[HeadProcess], tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    h = head_factory(tmp_path / "data", gpus=1, extra_args=("--tls-cert", str(cert), "--tls-key", str(key))).start()
    assert h.url.startswith("https://") and h.token
    with Client(h.url, verify=str(cert)) as c:
        assert c.whoami().cluster_admin
    # The CLI's own transport (issue 19) trusts what the SDK trusts: $SSL_CERT_FILE, else certifi.
    trusted = subprocess.run([*CLI, "whoami", "--json"], capture_output=True, text=True, timeout=60,
                             env={**h.env, "SSL_CERT_FILE": str(cert)})  # fmt: skip
    assert trusted.returncode == 0 and json.loads(trusted.stdout)["cluster_admin"], trusted.stderr
    unknown = subprocess.run([*CLI, "jobs"], capture_output=True, text=True, timeout=60, env=h.env)
    assert unknown.returncode == 1 and "cannot reach the head" in unknown.stderr and "Traceback" not in unknown.stderr
    with pytest.raises(httpx.HTTPError):
        httpx.get(h.url.replace("https://", "http://") + "/v1/health", timeout=5)


def test_user_management_warns_remaps_promotes_and_deletes(head: HeadProcess) -> None:
    """Issue 19: `add-user carol` without an account `carol` on a root head warned nobody, and no
    command changed an account, made a cluster admin or deleted a user."""
    if os.geteuid() != 0:
        pytest.skip("a head runs jobs as their submitters only as root")
    r = cli(head, "admin", "add-user", "gcnoacct", "--team", "t")
    assert r.returncode == 0, r.stderr
    assert "warning: there is no Unix account 'gcnoacct' on the head" in r.stderr
    token = r.stdout.strip().splitlines()[-1]
    refused = cli(head, "submit", "--", "true", token=token)
    assert refused.returncode == 1 and "no account 'gcnoacct'" in refused.stderr

    assert cli(head, "admin", "set-user", "gcnoacct", "--unix-user", "gcnosuch").returncode == 1
    r = cli(head, "admin", "set-user", "gcnoacct", "--unix-user", "nobody")
    assert r.returncode == 0 and "jobs run as nobody" in r.stdout and "warning" not in r.stderr, r.stderr
    with Client(head.url, token=token) as c:
        assert c.whoami().runs_jobs_as == "nobody"
        job = c.submit(["id", "-un"], workdir="/tmp")
        assert ended(c, job.id).state.value == "succeeded"

    r = cli(head, "admin", "set-user", "gcnoacct", "--cluster-admin", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["user"]["cluster_admin"] is True, r.stderr
    assert json.loads(cli(head, "whoami", "--json", token=token).stdout)["cluster_admin"] is True
    assert cli(head, "admin", "set-user", "gcnoacct", "--no-cluster-admin").returncode == 0

    r = cli(head, "admin", "delete-user", "gcnoacct")
    assert r.returncode == 0 and "deleted user gcnoacct" in r.stdout, r.stderr
    gone = cli(head, "whoami", token=token)
    assert gone.returncode == 1 and "token" in gone.stderr
    assert "gcnoacct" not in cli(head, "admin", "users").stdout
    again = cli(head, "admin", "delete-user", "gcnoacct")
    assert again.returncode == 1 and "no user 'gcnoacct'" in again.stderr
    me = json.loads(cli(head, "whoami", "--json").stdout)["user"]
    last = cli(head, "admin", "delete-user", me)
    assert last.returncode == 1 and "only cluster admin" in last.stderr
