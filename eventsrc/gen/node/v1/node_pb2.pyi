from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("from_seq",)
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    from_seq: int
    def __init__(self, from_seq: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("seq", "ts_ns", "correlation_id", "type", "version", "event_json", "corrupt", "reason", "skipped_from")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EVENT_JSON_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FROM_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ts_ns: int
    correlation_id: str
    type: str
    version: int
    event_json: str
    corrupt: bool
    reason: str
    skipped_from: int
    def __init__(self, seq: _Optional[int] = ..., ts_ns: _Optional[int] = ..., correlation_id: _Optional[str] = ..., type: _Optional[str] = ..., version: _Optional[int] = ..., event_json: _Optional[str] = ..., corrupt: _Optional[bool] = ..., reason: _Optional[str] = ..., skipped_from: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("loop_holds_since_ns",)
    LOOP_HOLDS_SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    loop_holds_since_ns: int
    def __init__(self, loop_holds_since_ns: _Optional[int] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("ready", "version", "instance_id", "last_seq", "sockets", "pid", "loop", "heap_trims", "retention", "fleet")
    READY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    SOCKETS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    LOOP_FIELD_NUMBER: _ClassVar[int]
    HEAP_TRIMS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    FLEET_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    version: str
    instance_id: str
    last_seq: int
    sockets: _containers.RepeatedScalarFieldContainer[str]
    pid: int
    loop: LoopHolds
    heap_trims: int
    retention: RetentionStatus
    fleet: FleetStatus
    def __init__(self, ready: _Optional[bool] = ..., version: _Optional[str] = ..., instance_id: _Optional[str] = ..., last_seq: _Optional[int] = ..., sockets: _Optional[_Iterable[str]] = ..., pid: _Optional[int] = ..., loop: _Optional[_Union[LoopHolds, _Mapping]] = ..., heap_trims: _Optional[int] = ..., retention: _Optional[_Union[RetentionStatus, _Mapping]] = ..., fleet: _Optional[_Union[FleetStatus, _Mapping]] = ...) -> None: ...

class FleetStatus(_message.Message):
    __slots__ = ("state", "reason", "shipped_seq", "lag_records", "lag_seconds")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SHIPPED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    state: str
    reason: str
    shipped_seq: int
    lag_records: int
    lag_seconds: float
    def __init__(self, state: _Optional[str] = ..., reason: _Optional[str] = ..., shipped_seq: _Optional[int] = ..., lag_records: _Optional[int] = ..., lag_seconds: _Optional[float] = ...) -> None: ...

class RetentionStatus(_message.Message):
    __slots__ = ("max_size_bytes", "max_age_seconds", "live_bytes", "failing", "failing_since_unix_ns", "failed_attempts", "failures_total", "retry_seconds", "cut_seconds", "cut_late", "appends_waiting")
    MAX_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FAILING_FIELD_NUMBER: _ClassVar[int]
    FAILING_SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FAILED_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RETRY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CUT_LATE_FIELD_NUMBER: _ClassVar[int]
    APPENDS_WAITING_FIELD_NUMBER: _ClassVar[int]
    max_size_bytes: int
    max_age_seconds: float
    live_bytes: int
    failing: str
    failing_since_unix_ns: int
    failed_attempts: int
    failures_total: int
    retry_seconds: float
    cut_seconds: float
    cut_late: bool
    appends_waiting: int
    def __init__(self, max_size_bytes: _Optional[int] = ..., max_age_seconds: _Optional[float] = ..., live_bytes: _Optional[int] = ..., failing: _Optional[str] = ..., failing_since_unix_ns: _Optional[int] = ..., failed_attempts: _Optional[int] = ..., failures_total: _Optional[int] = ..., retry_seconds: _Optional[float] = ..., cut_seconds: _Optional[float] = ..., cut_late: _Optional[bool] = ..., appends_waiting: _Optional[int] = ...) -> None: ...

class LoopHolds(_message.Message):
    __slots__ = ("steps", "longest_seconds", "longest_task", "over_10ms", "recent", "long_steps", "longest_cpu_seconds", "longest_cpu_task", "cpu_over_10ms")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_TASK_FIELD_NUMBER: _ClassVar[int]
    OVER_10MS_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    LONG_STEPS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_CPU_TASK_FIELD_NUMBER: _ClassVar[int]
    CPU_OVER_10MS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    longest_seconds: float
    longest_task: str
    over_10ms: int
    recent: _containers.RepeatedCompositeFieldContainer[LoopHold]
    long_steps: int
    longest_cpu_seconds: float
    longest_cpu_task: str
    cpu_over_10ms: int
    def __init__(self, steps: _Optional[int] = ..., longest_seconds: _Optional[float] = ..., longest_task: _Optional[str] = ..., over_10ms: _Optional[int] = ..., recent: _Optional[_Iterable[_Union[LoopHold, _Mapping]]] = ..., long_steps: _Optional[int] = ..., longest_cpu_seconds: _Optional[float] = ..., longest_cpu_task: _Optional[str] = ..., cpu_over_10ms: _Optional[int] = ...) -> None: ...

class LoopHold(_message.Message):
    __slots__ = ("end_monotonic_ns", "seconds", "task", "cpu_seconds", "process_cpu_seconds")
    END_MONOTONIC_NS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    end_monotonic_ns: int
    seconds: float
    task: str
    cpu_seconds: float
    process_cpu_seconds: float
    def __init__(self, end_monotonic_ns: _Optional[int] = ..., seconds: _Optional[float] = ..., task: _Optional[str] = ..., cpu_seconds: _Optional[float] = ..., process_cpu_seconds: _Optional[float] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("name", "kind", "requests", "limits", "claims")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LimitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    requests: _containers.ScalarMap[str, str]
    limits: _containers.ScalarMap[str, str]
    claims: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., requests: _Optional[_Mapping[str, str]] = ..., limits: _Optional[_Mapping[str, str]] = ..., claims: _Optional[_Iterable[str]] = ...) -> None: ...

class Pod(_message.Message):
    __slots__ = ("uid", "namespace", "name", "containers")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    uid: str
    namespace: str
    name: str
    containers: _containers.RepeatedCompositeFieldContainer[Container]
    def __init__(self, uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., containers: _Optional[_Iterable[_Union[Container, _Mapping]]] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("pod", "claims")
    POD_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    pod: Pod
    claims: _containers.RepeatedCompositeFieldContainer[ResourceClaim]
    def __init__(self, pod: _Optional[_Union[Pod, _Mapping]] = ..., claims: _Optional[_Iterable[_Union[ResourceClaim, _Mapping]]] = ...) -> None: ...

class ClaimResult(_message.Message):
    __slots__ = ("request", "driver", "pool", "device")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    request: str
    driver: str
    pool: str
    device: str
    def __init__(self, request: _Optional[str] = ..., driver: _Optional[str] = ..., pool: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...

class ClaimConsumer(_message.Message):
    __slots__ = ("resource", "name", "uid")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    resource: str
    name: str
    uid: str
    def __init__(self, resource: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ...) -> None: ...

class ResourceClaim(_message.Message):
    __slots__ = ("uid", "namespace", "name", "results", "reserved_for")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_FOR_FIELD_NUMBER: _ClassVar[int]
    uid: str
    namespace: str
    name: str
    results: _containers.RepeatedCompositeFieldContainer[ClaimResult]
    reserved_for: _containers.RepeatedCompositeFieldContainer[ClaimConsumer]
    def __init__(self, uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ClaimResult, _Mapping]]] = ..., reserved_for: _Optional[_Iterable[_Union[ClaimConsumer, _Mapping]]] = ...) -> None: ...

class PodSelector(_message.Message):
    __slots__ = ("uid", "namespace", "name")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    uid: str
    namespace: str
    name: str
    def __init__(self, uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("pod",)
    POD_FIELD_NUMBER: _ClassVar[int]
    pod: PodSelector
    def __init__(self, pod: _Optional[_Union[PodSelector, _Mapping]] = ...) -> None: ...

class ListPodsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPodsResponse(_message.Message):
    __slots__ = ("pods",)
    PODS_FIELD_NUMBER: _ClassVar[int]
    pods: _containers.RepeatedCompositeFieldContainer[PodInfo]
    def __init__(self, pods: _Optional[_Iterable[_Union[PodInfo, _Mapping]]] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("container_path", "host_path", "read_only")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    read_only: bool
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., read_only: _Optional[bool] = ...) -> None: ...

class DeviceSpec(_message.Message):
    __slots__ = ("container_path", "host_path", "permissions")
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    container_path: str
    host_path: str
    permissions: str
    def __init__(self, container_path: _Optional[str] = ..., host_path: _Optional[str] = ..., permissions: _Optional[str] = ...) -> None: ...

class ResourceAllocation(_message.Message):
    __slots__ = ("resource", "device_ids", "envs", "mounts", "devices", "annotations", "cdi_devices")
    class EnvsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    ENVS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    resource: str
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    envs: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceSpec]
    annotations: _containers.ScalarMap[str, str]
    cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource: _Optional[str] = ..., device_ids: _Optional[_Iterable[str]] = ..., envs: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[DeviceSpec, _Mapping]]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., cdi_devices: _Optional[_Iterable[str]] = ...) -> None: ...

class ContainerInfo(_message.Message):
    __slots__ = ("name", "kind", "resources", "cpu_ids", "claim_cdi_devices", "exclusive_cpus", "memory")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CPU_IDS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_CDI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    resources: _containers.RepeatedCompositeFieldContainer[ResourceAllocation]
    cpu_ids: _containers.RepeatedScalarFieldContainer[int]
    claim_cdi_devices: _containers.RepeatedScalarFieldContainer[str]
    exclusive_cpus: bool
    memory: _containers.RepeatedCompositeFieldContainer[MemoryBlock]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., resources: _Optional[_Iterable[_Union[ResourceAllocation, _Mapping]]] = ..., cpu_ids: _Optional[_Iterable[int]] = ..., claim_cdi_devices: _Optional[_Iterable[str]] = ..., exclusive_cpus: _Optional[bool] = ..., memory: _Optional[_Iterable[_Union[MemoryBlock, _Mapping]]] = ...) -> None: ...

class MemoryBlock(_message.Message):
    __slots__ = ("type", "size", "numa_nodes")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODES_FIELD_NUMBER: _ClassVar[int]
    type: str
    size: int
    numa_nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, type: _Optional[str] = ..., size: _Optional[int] = ..., numa_nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class PodInfo(_message.Message):
    __slots__ = ("uid", "namespace", "name", "state", "admitted_seq", "containers", "correlation_id", "removed_seq", "in_doubt")
    UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SEQ_FIELD_NUMBER: _ClassVar[int]
    IN_DOUBT_FIELD_NUMBER: _ClassVar[int]
    uid: str
    namespace: str
    name: str
    state: str
    admitted_seq: int
    containers: _containers.RepeatedCompositeFieldContainer[ContainerInfo]
    correlation_id: str
    removed_seq: int
    in_doubt: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[str] = ..., admitted_seq: _Optional[int] = ..., containers: _Optional[_Iterable[_Union[ContainerInfo, _Mapping]]] = ..., correlation_id: _Optional[str] = ..., removed_seq: _Optional[int] = ..., in_doubt: _Optional[_Iterable[int]] = ...) -> None: ...
