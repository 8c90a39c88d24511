"""The pods on the node: ``eventsrc admit`` and ``remove`` (through the daemon's node API),
``pods`` (what each container holds) and ``claims`` (the DRA claims, from the log)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventsrc.cli.options import Parents, Subparsers, add_output, open_reader, read_input

if TYPE_CHECKING:
    from eventsrc.inputs.claim_manifest import BoundClaim
    from eventsrc.inputs.manifest import PodSpec


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "admit",
        parents=[parents.root],
        help="admit a pod from its manifest",
        description="Admit a pod: send its manifest (a Kubernetes Pod, YAML or JSON, as 'kubectl get pod -o yaml' "
        "prints it) to the daemon, which gives its containers their devices. Prints what each container got "
        "(devices, envs, mounts, device nodes, annotations, CDI names). A missing metadata.uid is generated and "
        "printed. Exits 1 with the reason on stderr when the pod is refused, 2 when the manifest is malformed.",
    )
    p.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        type=Path,
        metavar="FILE",
        help="the pod manifest first ('-' for stdin), then the ResourceClaims it uses (resource.k8s.io v1 or v1beta1, "
        "as the scheduler left them: allocated, reserved for the pod)",
    )
    add_output(p)
    p.set_defaults(func=admit)

    p = sub.add_parser(
        "remove",
        parents=[parents.root],
        help="remove a pod and release what it holds",
        description="Remove a pod and release every device it holds: by --uid UID, or by NAMESPACE/NAME (a bare "
        "argument without '/' is a uid). A NAMESPACE/NAME that two live pods share is refused, with their uids.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("pod", nargs="?", metavar="NAMESPACE/NAME|UID", help="the pod's namespace/name, or its uid")
    which.add_argument("--uid", help="the pod's uid, taken as it is (also one recorded before uids were checked)")
    add_output(p)
    p.set_defaults(func=remove)

    p = sub.add_parser(
        "claims",
        parents=[parents.root],
        help="list DRA claims: prepared, pending, failed",
        description="The DRA claims as the log has them: their state (preparing, prepared, prepare-failed, "
        "unpreparing, unprepare-failed), driver, pods and last error. Pending work stays listed until the "
        "driver answers.",
    )
    add_output(p)
    p.set_defaults(func=claims)

    p = sub.add_parser(
        "pods",
        parents=[parents.root],
        help="list the pods and what they hold",
        description="List the daemon's pods and what each container holds.",
    )
    add_output(p)
    p.set_defaults(func=pods)


def _read(path: Path) -> bytes:
    from eventsrc.inputs.manifest import ManifestError

    try:
        return read_input(path)
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror}") from None


def admit(args: argparse.Namespace) -> int:
    import uuid

    import msgspec

    from eventsrc.api.node import pod_to_proto
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2
    from eventsrc.inputs.claim_manifest import check_claims, parse_claims, pod_claims
    from eventsrc.inputs.manifest import pod_spec, read_pod
    from eventsrc.offline import render

    # The first file is the pod; the others are the ResourceClaims it uses.
    source = str(args.files[0])
    pod = read_pod(_read(args.files[0]), source)
    spec = pod_spec(pod, source)
    claims = [c for path in args.files[1:] for c in parse_claims(_read(path), str(path))]
    refs = pod_claims(pod, source)
    bound: list[BoundClaim] = []
    if refs or claims:
        bound = check_claims(spec.pod.uid, spec.pod.namespace, spec.pod.name, refs, claims)
        spec = _with_claim_uids(spec, bound)
    if not spec.pod.uid:
        spec = msgspec.structs.replace(spec, pod=msgspec.structs.replace(spec.pod, uid=str(uuid.uuid4())))
        print(f"eventsrc: generated uid {spec.pod.uid} for {spec.pod.namespace}/{spec.pod.name}", file=sys.stderr)
    request = node_pb2.AdmitRequest(pod=pod_to_proto(spec), claims=[_claim_proto(b) for b in bound])
    info = call(args.layout, unary("Admit", request))
    render.print_pod(info, args.output)
    return 0


def _with_claim_uids(spec: PodSpec, bound: list[BoundClaim]) -> PodSpec:
    """The pod with each container's claims named by ResourceClaim uid, not pod claim name
    (claims that need no ResourceClaim are left out)."""
    import msgspec

    uid_of = {b.pod_claim.name: b.claim.uid for b in bound}
    containers = [
        msgspec.structs.replace(c, claims=[uid_of[n] for n in c.claims if n in uid_of]) for c in spec.containers
    ]
    return msgspec.structs.replace(spec, containers=containers)


def _claim_proto(bound: BoundClaim) -> Any:
    from eventsrc.gen.node.v1 import node_pb2

    c = bound.claim
    return node_pb2.ResourceClaim(
        uid=c.uid,
        namespace=c.namespace,
        name=c.name,
        results=[
            node_pb2.ClaimResult(request=r.request, driver=r.driver, pool=r.pool, device=r.device) for r in c.results
        ],
        reserved_for=[node_pb2.ClaimConsumer(resource=p.resource, name=p.name, uid=p.uid) for p in c.reserved_for],
    )


def remove(args: argparse.Namespace) -> int:
    from eventsrc.cli.client import call, unary
    from eventsrc.errors import BadRequest
    from eventsrc.gen.node.v1 import node_pb2
    from eventsrc.offline import render

    sel = node_pb2.PodSelector()
    if args.uid is not None:
        sel.uid = args.uid
    elif args.pod.count("/") == 1:  # neither a namespace nor a name holds a '/'
        sel.namespace, sel.name = args.pod.split("/")
        if not sel.namespace or not sel.name:
            raise BadRequest(f"{args.pod!r}: give NAMESPACE/NAME, or --uid UID")
    elif "/" in args.pod:
        raise BadRequest(f"{args.pod!r} is neither NAMESPACE/NAME nor a uid; give --uid UID for a uid with '/'")
    else:
        sel.uid = args.pod
    info = call(args.layout, unary("Remove", node_pb2.RemoveRequest(pod=sel)))
    render.print_pod(info, args.output)
    return 0


def pods(args: argparse.Namespace) -> int:
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2
    from eventsrc.offline import render

    resp = call(args.layout, unary("ListPods", node_pb2.ListPodsRequest()))
    render.print_pods(list(resp.pods), args.output)
    return 0


def claims(args: argparse.Namespace) -> int:
    import msgspec

    from eventsrc.log.snapshots import load_views
    from eventsrc.offline import render

    views, _ = load_views(open_reader(args.layout), args.layout.snapshots)
    if args.output == "json":
        sys.stdout.write(msgspec.json.encode(views.claims).decode() + "\n")
        return 0
    rows = []
    for uid, c in sorted(views.claims.claims.items()):
        cdi = " ".join(i for d in c.devices for i in d.cdi_device_ids)
        rows.append(
            (f"{c.namespace}/{c.name}", uid, c.driver, c.state, ",".join(c.pods) or "-", cdi or "-", c.error or "-")
        )
    columns = ("claim", "uid", "driver", "state", "pods", "cdi devices", "error")
    render.console().print(render.table(f"claims ({len(views.claims.claims)})", columns, rows))
    return 0
