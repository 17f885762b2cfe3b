//! `/proc/<pid>/cgroup` → the pod UID and container ID of a process.
//!
//! Pure parsing. Known layouts, for cgroup v1 (one line per hierarchy) and v2 (`0::`):
//! - systemd driver: `…/kubepods-<qos>-pod<uid_with_underscores>.slice/<runtime>-<id>.scope`
//!   where `<runtime>` is `cri-containerd`, `crio` or `docker`;
//! - cgroupfs driver: `…/kubepods/<qos>/pod<uid>/<id>` (containerd, Docker) or `…/crio-<id>`.
//!
//! Seen from a private cgroup namespace the path is relative to the agent's own cgroup
//! (`/../../kubepods-…`); the pod segment is found wherever it sits. Containers without
//! a pod (Docker, ECS tasks) are [`Placement::Container`]. Anything else that
//! mentions Kubernetes is [`Placement::Unknown`]: counted by the caller, never guessed.

/// Where a process sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In a pod: its UID (with dashes, as in `metadata.uid`), and the container ID when
    /// the process is in a container's cgroup rather than the pod's own.
    Pod { pod_uid: String, container_id: Option<String> },
    /// In a container that no pod owns (plain Docker): nothing to attribute.
    Container { container_id: String },
    /// Not in a container.
    Host,
    /// A layout this parser does not know, or a malformed file.
    Unknown,
}

/// Reads the content of `/proc/<pid>/cgroup`.
pub fn parse(content: &str) -> Placement {
    let mut pod: Option<(String, Option<String>)> = None;
    let mut container: Option<String> = None;
    let mut lines = 0;
    for line in content.lines().map(str::trim).filter(|l| !l.is_empty()) {
        lines += 1;
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(_controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            return Placement::Unknown;
        };
        if id.parse::<u32>().is_err() || !path.starts_with('/') {
            return Placement::Unknown;
        }
        match parse_path(path) {
            Placement::Pod { pod_uid, container_id } => match &mut pod {
                None => pod = Some((pod_uid, container_id)),
                // Hierarchies of one process must agree; a pod-level line may stand beside
                // container-level ones (a controller not delegated to the container).
                Some((uid, cid)) => {
                    if *uid != pod_uid {
                        return Placement::Unknown;
                    }
                    match (cid.as_ref(), container_id) {
                        (Some(a), Some(b)) if *a != b => return Placement::Unknown,
                        (None, Some(b)) => *cid = Some(b),
                        _ => {}
                    }
                }
            },
            Placement::Container { container_id } => {
                if container.get_or_insert_with(|| container_id.clone()) != &container_id {
                    return Placement::Unknown;
                }
            }
            Placement::Host => {}
            Placement::Unknown => return Placement::Unknown,
        }
    }
    match (pod, container) {
        _ if lines == 0 => Placement::Unknown,
        (Some((pod_uid, container_id)), None) => Placement::Pod { pod_uid, container_id },
        (Some(_), Some(_)) => Placement::Unknown,
        (None, Some(container_id)) => Placement::Container { container_id },
        (None, None) => Placement::Host,
    }
}

/// One hierarchy's path.
fn parse_path(path: &str) -> Placement {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // A cgroup namespace shows paths outside it as `/..`: the kubepods root may be hidden.
    let namespaced = segments.first() == Some(&"..");
    for (i, segment) in segments.iter().enumerate() {
        let under_kubepods = namespaced || segments[..i].iter().any(|s| s.contains("kubepods"));
        let Some(pod_uid) = pod_uid(segment, under_kubepods) else {
            continue;
        };
        let container_id = match segments.get(i + 1) {
            None => None,
            Some(next) => match container_id(next) {
                Some(id) => Some(id),
                None => return Placement::Unknown,
            },
        };
        return Placement::Pod { pod_uid, container_id };
    }
    if segments.iter().any(|s| s.contains("kubepods")) {
        return Placement::Unknown;
    }
    // Docker without Kubernetes: `/docker/<id>` (cgroupfs), `…/docker-<id>.scope` (systemd:
    // `system.slice`, or ECS's `ecstasks.slice/ecstasks-<task>.slice` with task limits on
    // cgroup v2), ECS's `/ecs/<task>/<id>` (cgroupfs with task limits, cgroup v1).
    for (i, segment) in segments.iter().enumerate() {
        let parent = |n: usize| i.checked_sub(n).map(|j| segments[j]);
        let id = match segment.strip_prefix("docker-").and_then(|s| s.strip_suffix(".scope")) {
            Some(id) => Some(id),
            None if parent(1) == Some("docker") => Some(*segment),
            None if parent(2) == Some("ecs") && parent(1).is_some_and(is_uid) => Some(*segment),
            None => None,
        };
        if let Some(id) = id.filter(|id| is_container_id(id)) {
            return Placement::Container { container_id: id.to_owned() };
        }
    }
    Placement::Host
}

/// `pod<uid>` (cgroupfs, under a kubepods cgroup) or `kubepods[-<qos>]-pod<uid_>.slice`
/// (systemd, dashes of the UID written as underscores).
fn pod_uid(segment: &str, under_kubepods: bool) -> Option<String> {
    if let Some(uid) = segment.strip_prefix("pod") {
        return (under_kubepods && is_uid(uid)).then(|| uid.to_owned());
    }
    let slice = segment.strip_suffix(".slice")?;
    let (prefix, uid) = slice.rsplit_once("-pod")?;
    if !prefix.contains("kubepods") || uid.contains('-') {
        return None;
    }
    let uid = uid.replace('_', "-");
    is_uid(&uid).then_some(uid)
}

/// A UUID (`metadata.uid` of API pods; an ECS task ID of the old format), or 32 hex
/// digits (the UID of a static pod; an ECS task ID of the current format).
fn is_uid(uid: &str) -> bool {
    let b = uid.as_bytes();
    match b.len() {
        32 => b.iter().all(u8::is_ascii_hexdigit),
        36 => b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        }),
        _ => false,
    }
}

/// The container segment under a pod: `<id>`, `crio-<id>`, or `<runtime>-<id>.scope`.
/// `crio-conmon-<id>.scope` is CRI-O's monitor, not the container: unknown.
fn container_id(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    let id = ["cri-containerd-", "crio-", "docker-"].iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name);
    // A bare id is cgroupfs only; a scope always carries a runtime prefix.
    if id.len() == name.len() && segment.ends_with(".scope") {
        return None;
    }
    is_container_id(id).then(|| id.to_owned())
}

/// containerd, CRI-O and Docker all use 64 lowercase hex digits.
fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1f3a9c2e-7b4d-4e8a-9c1f-2d3e4f5a6b7c";
    const CID: &str = "3b5e2a1f9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";

    macro_rules! file {
        ($name:literal) => {
            include_str!(concat!("testdata/cgroup/", $name, ".txt"))
        };
    }

    fn in_pod(uid: &str, container: Option<&str>) -> Placement {
        Placement::Pod { pod_uid: uid.to_owned(), container_id: container.map(str::to_owned) }
    }

    #[test]
    fn every_known_kubernetes_layout_gives_pod_and_container() {
        for (name, content) in [
            ("v2-systemd-containerd-burstable", file!("v2-systemd-containerd-burstable")),
            ("v2-systemd-containerd-guaranteed", file!("v2-systemd-containerd-guaranteed")),
            ("v2-systemd-crio-besteffort", file!("v2-systemd-crio-besteffort")),
            ("v2-systemd-docker", file!("v2-systemd-docker")),
            ("v2-cgroupfs-containerd-besteffort", file!("v2-cgroupfs-containerd-besteffort")),
            ("v2-cgroupfs-crio-guaranteed", file!("v2-cgroupfs-crio-guaranteed")),
            ("v2-namespaced-systemd", file!("v2-namespaced-systemd")),
            ("v2-namespaced-cgroupfs", file!("v2-namespaced-cgroupfs")),
            ("v2-kind-nested-systemd", file!("v2-kind-nested-systemd")),
            ("v1-cgroupfs-docker", file!("v1-cgroupfs-docker")),
            ("v1-systemd-containerd", file!("v1-systemd-containerd")),
        ] {
            assert_eq!(parse(content), in_pod(UID, Some(CID)), "{name}");
        }
    }

    #[test]
    fn a_static_pod_uid_is_a_hash() {
        assert_eq!(parse(file!("v1-systemd-static-pod")), in_pod("0f6d5c4b3a29180716253443f2e1d0c9", Some(CID)));
    }

    #[test]
    fn a_process_in_the_pod_cgroup_itself_has_a_pod_and_no_container() {
        assert_eq!(parse(file!("pod-level-no-container")), in_pod(UID, None));
        // A controller left at the pod level beside container-level ones.
        let mixed = format!("2:cpu:/kubepods/burstable/pod{UID}\n1:memory:/kubepods/burstable/pod{UID}/{CID}\n");
        assert_eq!(parse(&mixed), in_pod(UID, Some(CID)));
    }

    #[test]
    fn host_processes_and_plain_docker_are_not_in_a_pod() {
        assert_eq!(parse(file!("host-systemd-service")), Placement::Host);
        assert_eq!(parse(file!("host-v1-user-session")), Placement::Host);
        assert_eq!(parse("0::/\n"), Placement::Host);
        assert_eq!(parse(file!("docker-without-kubernetes")), Placement::Container { container_id: CID.to_owned() });
        assert_eq!(parse(&format!("4:memory:/docker/{CID}\n")), Placement::Container { container_id: CID.to_owned() });
    }

    #[test]
    fn ecs_task_containers_are_containers() {
        let container = Placement::Container { container_id: CID.to_owned() };
        // cgroup v1, task limits on (cgroupfs): every hierarchy under /ecs/<task>/<id>.
        assert_eq!(parse(file!("v1-ecs-task")), container);
        // cgroup v2, task limits on (systemd), seen from the host and from a container's
        // own cgroup namespace.
        let task = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
        assert_eq!(parse(&format!("0::/ecstasks.slice/ecstasks-{task}.slice/docker-{CID}.scope\n")), container);
        assert_eq!(parse(&format!("0::/../../ecstasks.slice/ecstasks-{task}.slice/docker-{CID}.scope\n")), container);
        // An old-format task ID is a UUID.
        assert_eq!(parse(&format!("3:cpu:/ecs/{UID}/{CID}\n")), container);
        // Not a task ID: not ECS's layout.
        assert_eq!(parse(&format!("3:cpu:/ecs/web/{CID}\n")), Placement::Host);
    }

    #[test]
    fn unknown_and_malformed_files_are_unknown() {
        for (name, content) in [
            ("bad-empty", file!("bad-empty")),
            ("bad-not-a-cgroup-file", file!("bad-not-a-cgroup-file")),
            ("bad-short-container-id", file!("bad-short-container-id")),
            ("bad-uid", file!("bad-uid")),
            ("bad-crio-conmon", file!("bad-crio-conmon")),
            ("bad-disagreeing-hierarchies", file!("bad-disagreeing-hierarchies")),
            ("bad-kubepods-without-pod", file!("bad-kubepods-without-pod")),
            ("bad-missing-hierarchy-id", file!("bad-missing-hierarchy-id")),
            ("bad-unknown-runtime", file!("bad-unknown-runtime")),
        ] {
            assert_eq!(parse(content), Placement::Unknown, "{name}");
        }
    }

    #[test]
    fn pod_segments_need_kubernetes_context_and_exact_ids() {
        // `pod<uuid>` outside kubepods is someone else's naming.
        assert_eq!(parse(&format!("0::/system.slice/pod{UID}/{CID}\n")), Placement::Host);
        // Upper-case hex is not what runtimes write.
        let upper = CID.to_uppercase();
        assert_eq!(parse(&format!("0::/kubepods/pod{UID}/{upper}\n")), Placement::Unknown);
        // Dashes inside a systemd slice's UID are not the systemd escaping.
        assert_eq!(
            parse(&format!("0::/kubepods.slice/kubepods-pod{UID}.slice/crio-{CID}.scope\n")),
            Placement::Unknown
        );
        // A bare id as a scope name has no runtime.
        assert_eq!(parse(&format!("0::/kubepods/pod{UID}/{CID}.scope\n")), Placement::Unknown);
    }
}
