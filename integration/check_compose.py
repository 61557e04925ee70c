"""Checks docker-compose.yml's structure without a Docker engine: the
services the README names, a healthcheck on each, the Dockerfile it builds,
and that every host file it mounts exists in the repository.

usage: check_compose.py [REPO_DIR]
"""

import os
import sys

import yaml

repo = sys.argv[1] if len(sys.argv) > 1 else "."
doc = yaml.safe_load(open(os.path.join(repo, "docker-compose.yml")))
problems = []
services = doc.get("services", {})
for name in ("autocdc", "postgres", "seaweedfs", "nats"):
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
if problems:
    sys.exit("docker-compose.yml: " + "; ".join(problems))
print(f"docker-compose.yml: {len(services)} services, structure ok")
