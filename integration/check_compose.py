"""Checks docker-compose.yml's structure without a Docker engine: the
services docs/docker.md names, a healthcheck on each, the Dockerfile it builds,
that every host file it mounts exists in the repository, that the three
autocdc services run one image built one way, that the scale-out replicas
share what they must (the NATS log and a catalog both reach, not a local
warehouse) and keep their own data volume, and that the Dockerfile's stages
are in the order the legacy builder needs (integration/compose.sh builds
`runtime-prebuilt`, users the last stage, from source).

usage: check_compose.py [REPO_DIR]
"""

import os
import sys
import tomllib

import yaml

repo = sys.argv[1] if len(sys.argv) > 1 else "."
doc = yaml.safe_load(open(os.path.join(repo, "docker-compose.yml")))
problems = []
services = doc.get("services", {})
for name in ("autocdc", "autocdc-a", "autocdc-b", "postgres", "seaweedfs", "nats"):
    svc = services.get(name)
    if svc is None:
        problems.append(f"service {name} is missing")
        continue
    if "healthcheck" not in svc or "test" not in svc["healthcheck"]:
        problems.append(f"service {name} has no healthcheck")
    if "image" not in svc and "build" not in svc:
        problems.append(f"service {name} has neither image nor build")
    for v in svc.get("volumes", []):
        src = v.split(":")[0]
        if src.startswith("."):
            if not os.path.exists(os.path.join(repo, src)):
                problems.append(f"service {name} mounts {src}, which does not exist")
        elif src not in (doc.get("volumes") or {}):
            problems.append(f"service {name} uses volume {src}, which is not declared")
build = services.get("autocdc", {}).get("build", {})
dockerfile = os.path.join(repo, build.get("context", "."), build.get("dockerfile", "Dockerfile"))
if not os.path.exists(dockerfile):
    problems.append(f"{dockerfile} does not exist")
autocdcs = [services.get(n, {}) for n in ("autocdc", "autocdc-a", "autocdc-b")]
if len({str(svc.get("image")) for svc in autocdcs}) != 1 or "image" not in autocdcs[0]:
    problems.append("autocdc, autocdc-a and autocdc-b do not name one image")
if len({repr(svc.get("build")) for svc in autocdcs}) != 1:
    problems.append("autocdc, autocdc-a and autocdc-b build their image differently")
if os.path.exists(dockerfile):
    # The legacy builder (Debian's docker.io) builds every stage above its
    # target: the prebuilt runtime must come before anything that compiles,
    # and the default (last) stage is the runtime built from source.
    stages = [line.split() for line in open(dockerfile) if line.upper().startswith("FROM ")]
    names = [st[3] if len(st) > 3 and st[2].upper() == "AS" else None for st in stages]
    compiling = [i for i, st in enumerate(stages) if st[1].startswith("rust:")]
    if "runtime-prebuilt" not in names:
        problems.append("Dockerfile has no runtime-prebuilt stage")
    elif compiling and names.index("runtime-prebuilt") > compiling[0]:
        problems.append("Dockerfile: runtime-prebuilt comes after a compiling stage")
    if names and names[-1] != "runtime":
        problems.append("Dockerfile: the last stage (the default) is not `runtime`")
replicas = autocdcs[1:]
configs, data = set(), []
for name, svc in zip(("autocdc-a", "autocdc-b"), replicas):
    if "scale-out" not in svc.get("profiles", []):
        problems.append(f"service {name} is not in the scale-out profile")
    for v in svc.get("volumes", []):
        src, dst = v.split(":")[:2]
        if dst == "/etc/autocdc/autocdc.toml":
            configs.add(src)
        elif dst == "/var/lib/autocdc":
            data.append(src)
if len(configs) != 1:
    problems.append(f"the scale-out replicas mount different configs: {sorted(configs)}")
for src in configs:
    path = os.path.join(repo, src)
    if os.path.exists(path):
        cfg = tomllib.load(open(path, "rb"))
        if cfg.get("ingest", {}).get("type") != "nats":
            problems.append(f"{src}: the replicas need [ingest] type = \"nats\"")
        cat = cfg.get("catalog", {})
        if cat.get("type") == "hadoop" and not str(cat.get("warehouse", "")).startswith("s3://"):
            problems.append(f"{src}: a local Hadoop warehouse is not shared by the replicas")
if len(set(data)) != len(data):
    problems.append(f"the scale-out replicas share a data volume: {data}")
if problems:
    sys.exit("docker-compose.yml: " + "; ".join(problems))
print(f"docker-compose.yml: {len(services)} services, structure ok")
