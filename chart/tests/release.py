"""Installs or upgrades the chart with Helm's own library, for tests that
drive a release from outside pytest (the runner's rollout test).

    python3 chart/tests/release.py install|upgrade --kubeconfig K \
        --namespace N --release R --values '{"replicaCount": 3}'

Prints the release's name, namespace and revision as JSON on success; a
Helm error exits 1 with Helm's message on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import helm_sdkpy

CHART = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["install", "upgrade"])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--release", required=True)
    parser.add_argument("--values", default="{}", help="the values, as JSON")
    args = parser.parse_args()
    values = json.loads(args.values)
    config = helm_sdkpy.Configuration(
        namespace=args.namespace, kubeconfig=args.kubeconfig, plain_http=True
    )
    try:
        if args.action == "install":
            release = asyncio.run(
                helm_sdkpy.Install(config).run(
                    args.release, str(CHART), values=values, wait=False,
                    timeout=60, create_namespace=True,
                )
            )
        else:
            release = asyncio.run(
                helm_sdkpy.Upgrade(config).run(
                    args.release, str(CHART), values=values, wait=False, timeout=60,
                )
            )
    except helm_sdkpy.HelmError as err:
        print(f"helm {args.action} failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps({
        "name": release.get("name"),
        "namespace": release.get("namespace"),
        "version": release.get("version"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
