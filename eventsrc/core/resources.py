"""Kubernetes resource quantities and pod QoS classes, as the API server and kubelet read them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction

from eventsrc.events import ContainerSpec

_QUANTITY = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


class QuantityError(ValueError):
    pass


def parse_quantity(text: str) -> Fraction:
    """A quantity ("2", "500m", "1.5", "1Gi", "1e3") as an exact number."""
    m = _QUANTITY.match(text.strip())
    if m is None:
        raise QuantityError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    sign, number, exponent, suffix = m.groups()
    value = Fraction(number)
    if exponent:
        value *= Fraction(10) ** int(exponent[1:])
    else:
        value *= _SUFFIX[suffix or ""]
    return -value if sign == "-" else value


def milli_cpus(text: str) -> int:
    """CPU quantity in millicores, rounded up as the API server rounds ("0.0001" -> 1m)."""
    v = parse_quantity(text) * 1000
    return int(v) if v.denominator == 1 else int(v) + (1 if v > 0 else 0)


def _requests(c: ContainerSpec) -> dict[str, str]:
    # The API server defaults requests to limits where only a limit is given.
    return {**c.limits, **c.requests}


def qos_class(containers: Iterable[ContainerSpec]) -> str:
    """The pod's QoS class (GetPodQOS): Guaranteed, Burstable or BestEffort."""
    containers = list(containers)
    compute = ("cpu", "memory")
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for c in containers:
        reqs = _requests(c)
        for name in compute:
            if name in reqs and parse_quantity(reqs[name]) != 0:
                requests[name] = requests.get(name, Fraction(0)) + parse_quantity(reqs[name])
            if name in c.limits and parse_quantity(c.limits[name]) != 0:
                limits[name] = limits.get(name, Fraction(0)) + parse_quantity(c.limits[name])
        if not all(name in c.limits and parse_quantity(c.limits[name]) != 0 for name in compute):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(requests.get(n) == limits.get(n) for n in compute):
        return "Guaranteed"
    return "Burstable"


def exclusive_cpus(qos: str, container: ContainerSpec) -> int:
    """Exclusive CPUs the static policy gives: the CPU request of a container of a
    Guaranteed pod when it is a whole number, else 0 (the shared pool)."""
    if qos != "Guaranteed":
        return 0
    req = _requests(container).get("cpu")
    if req is None:
        return 0
    milli = milli_cpus(req)
    return milli // 1000 if milli % 1000 == 0 else 0
