"""Build a signed apt repository of container-toolkit packages for the Molecule scenario.

NVIDIA's repository is not reachable from the test machines, so the scenario installs from this
one instead. What it tests is real: apt checks the repository's signature against the keyring the
role installs (deb822 Signed-By), the role's pin picks 1.17.8 although 1.18.0 is newer, and
`nvidia-ctk runtime configure` edits daemon.json. The packages are stand-ins with NVIDIA's names
and dependencies; their nvidia-ctk does only `runtime configure --runtime=docker`, with the real
tool's effect on daemon.json (the nvidia runtime added, other keys kept, --set-as-default).

    python build_repo.py OUT   ->  OUT/repo/{amd64/*.deb,amd64/Packages,amd64/InRelease}, OUT/key.asc
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

VERSIONS = ["1.17.8-1", "1.18.0-1"]
ARCH = "amd64"

NVIDIA_CTK = textwrap.dedent(
    '''\
    #!/usr/bin/python3
    """Test stand-in for nvidia-ctk: `runtime configure --runtime=docker [--config=PATH] [--set-as-default]`."""
    import argparse, json, sys
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="nvidia-ctk")
    parser.add_argument("--version", action="version", version="nvidia-ctk @VERSION@ (test stand-in)")
    sub = parser.add_subparsers(dest="group", required=True)
    runtime = sub.add_parser("runtime").add_subparsers(dest="action", required=True)
    configure = runtime.add_parser("configure")
    configure.add_argument("--runtime", required=True, choices=["docker"])
    configure.add_argument("--config", default="/etc/docker/daemon.json")
    configure.add_argument("--set-as-default", action="store_true")
    args = parser.parse_args()
    path = Path(args.config)
    config = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
    config.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
    if args.set_as_default:
        config["default-runtime"] = "nvidia"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=4) + "\\n")
    print(f"INFO[0000] Wrote updated config to {path}", file=sys.stderr)
    '''
)


def package(out: Path, name: str, version: str, depends: list[str], files: dict[str, tuple[str, int]]) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        control = [
            f"Package: {name}",
            f"Version: {version}",
            f"Architecture: {ARCH}",
            "Maintainer: vllm-fleet tests <tests@vllm-fleet.invalid>",
            f"Description: test stand-in for NVIDIA's {name}",
        ]
        if depends:
            control.append("Depends: " + ", ".join(depends))
        (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
        for path, (content, mode) in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(mode)
        deb = out / f"{name}_{version}_{ARCH}.deb"
        build = ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)]
        subprocess.run(build, check=True, capture_output=True)
        return deb


def packages_entry(deb: Path, repo: Path) -> str:
    fields = subprocess.run(["dpkg-deb", "--field", str(deb)], check=True, capture_output=True, text=True).stdout
    data = deb.read_bytes()
    where = f"Filename: ./{deb.relative_to(repo / ARCH)}\nSize: {len(data)}"
    return fields.rstrip("\n") + f"\n{where}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"


def main(out: Path) -> None:
    repo = out / "repo"
    debs_dir = repo / ARCH
    debs_dir.mkdir(parents=True, exist_ok=True)
    debs = []
    for version in VERSIONS:
        same = f"(= {version})"
        debs.append(package(debs_dir, "libnvidia-container1", version, [], {}))
        debs.append(package(debs_dir, "libnvidia-container-tools", version, [f"libnvidia-container1 {same}"], {}))
        ctk = NVIDIA_CTK.replace("@VERSION@", version.split("-")[0])
        ctk_file = {"/usr/bin/nvidia-ctk": (ctk, 0o755)}
        debs.append(package(debs_dir, "nvidia-container-toolkit-base", version, [], ctk_file))
        debs.append(
            package(
                debs_dir,
                "nvidia-container-toolkit",
                version,
                [f"nvidia-container-toolkit-base {same}", f"libnvidia-container-tools {same}"],
                {},
            )
        )
    packages = "\n".join(packages_entry(deb, repo) for deb in debs)
    (debs_dir / "Packages").write_text(packages)
    digest = hashlib.sha256(packages.encode()).hexdigest()
    release = "Origin: vllm-fleet tests\nLabel: container toolkit stand-ins\n"
    release += f"SHA256:\n {digest} {len(packages.encode())} Packages\n"
    (debs_dir / "Release").write_text(release)

    home = out / "gnupg"
    home.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, GNUPGHOME=str(home))
    gpg = ["gpg", "--batch", "--quiet", "--yes"]
    if not (out / "key.asc").exists():
        new_key = ["--passphrase", "", "--quick-generate-key", "vllm-fleet test repository", "ed25519", "sign", "1d"]
        subprocess.run([*gpg, *new_key], check=True, env=env)
        key = subprocess.run([*gpg, "--armor", "--export"], check=True, env=env, capture_output=True, text=True).stdout
        (out / "key.asc").write_text(key)
    sign = ["--clearsign", "--output", str(debs_dir / "InRelease"), str(debs_dir / "Release")]
    try:
        subprocess.run([*gpg, *sign], check=True, env=env)
    finally:
        # gpg started an agent for this key folder; leave no process behind.
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, env=env)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
