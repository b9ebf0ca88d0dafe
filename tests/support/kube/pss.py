"""Pod Security Standards, "restricted" profile (Kubernetes 1.32), as a checker for rendered pod specs.

Written from https://kubernetes.io/docs/concepts/security/pod-security-standards/ — every control of
the baseline and restricted profiles that a pod spec can violate:
baseline: hostProcess, host namespaces, privileged, capabilities beyond the default set, hostPath
volumes, host ports, AppArmor, SELinux, /proc mount, seccomp Unconfined, unsafe sysctls;
restricted: volume types, privilege escalation, runAsNonRoot, runAsUser 0, seccomp RuntimeDefault or
Localhost, capabilities drop ALL and add at most NET_BIND_SERVICE.
"""

from __future__ import annotations

from typing import Any

ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
    "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """Every violation of the restricted profile in a pod spec (empty: compliant)."""
    out: list[str] = []
    pod_ctx = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"spec.{key} must be false")
    if (pod_ctx.get("windowsOptions") or {}).get("hostProcess"):
        out.append("hostProcess pods are not allowed")
    for vol in spec.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {vol['name']}: type {sorted(kinds)} not allowed")
    for sysctl in pod_ctx.get("sysctls", []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')} not allowed")
    out += _selinux_apparmor(pod_ctx, "pod")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    pod_nonroot = pod_ctx.get("runAsNonRoot")
    if pod_ctx.get("runAsUser") == 0:
        out.append("pod runAsUser must not be 0")
    for c in _containers(spec):
        name, ctx = c.get("name"), c.get("securityContext") or {}
        if ctx.get("privileged"):
            out.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        if ctx.get("runAsNonRoot", pod_nonroot) is not True:
            out.append(f"{name}: runAsNonRoot must be true (container or pod)")
        if ctx.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser must not be 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost (container or pod)")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities must drop ALL")
        extra = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if extra:
            out.append(f"{name}: capabilities {sorted(extra)} may not be added")
        if ctx.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount must be Default")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                out.append(f"{name}: hostPort {port['hostPort']} not allowed")
        out += _selinux_apparmor(ctx, str(name))
    return out


def _selinux_apparmor(ctx: dict[str, Any], where: str) -> list[str]:
    out = []
    se = ctx.get("seLinuxOptions") or {}
    if se.get("type", "") not in SELINUX_TYPES or se.get("user") or se.get("role"):
        out.append(f"{where}: seLinuxOptions not allowed")
    if (ctx.get("appArmorProfile") or {}).get("type") == "Unconfined":
        out.append(f"{where}: AppArmor Unconfined not allowed")
    return out
