//! Support for tests against real components, started by the tests themselves:
//! - [`ControlPlane`]: etcd + kube-apiserver + the garbage-collector, namespace and
//!   service-account controllers, in one process (`tests/controlplane`), shared by all
//!   tests of a test binary; each test works in a namespace of its own.
//! - [`tool`]: the test tools `tests/tools/install.sh` installs in its bin/ (controlplane,
//!   helm, prometheus, promtool; LocalStack has a venv of its own: [`localstack`]).
//! - [`workspace_bin`]: the project's own binaries (`cargo build --workspace --bins`).
//! - [`chart`]: the Helm chart rendered, its objects, a container's args and environment.
//! - [`https`]: an HTTPS client for the metrics ports, and a Secret volume laid out as
//!   the kubelet lays it out.
//! - [`prometheus`]: a real Prometheus (scraping, or Prometheus 3 receiving OTLP);
//!   [`otlp`]: a test OTLP receiver that records what it is sent; [`dashboard`]: the
//!   chart dashboard's queries.
//! - [`real_node`]: a real one-node cluster (kubelet, containerd) from `tests/realnode.sh`,
//!   stopped and the machine restored when dropped; [`relay`]: a TCP relay from its
//!   pods' bridge to a loopback service.
//!
//! - the common test support (fixtures, [`TempDir`], [`http_get`]), re-exported from
//!   `neuron-test-support` (tests/support).
//!
//! Every process started here dies with the test binary, even when a test panics: it is
//! started from a thread that lives as long as the process, with the parent-death
//! signal set, and is stopped gracefully (SIGTERM) so it cleans up after itself.

pub mod chart;
pub mod dashboard;
pub mod fleet;
pub mod https;
pub mod localstack;
pub mod otlp;
pub mod prometheus;
pub mod real_node;
pub mod relay;

// The workspace's common test support, for the tests built on this crate.
pub use neuron_test_support::{fixture_path, free_port, http_get, random_u32, TempDir, PROMETHEUS_OPERATOR_CRDS};

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, OnceLock},
    time::Duration,
};

use anyhow::{anyhow, bail, Context};
use k8s_openapi::{
    api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::{Namespace, ServiceAccount},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    Api, Client, Config,
};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A test tool installed by `tests/tools/install.sh` (in `$NEURON_TOOLS_DIR/bin`,
/// default `target/tools/bin`, or on PATH). A missing tool fails the test with a clear
/// message: these tests never pass by skipping.
pub fn tool(name: &str) -> PathBuf {
    let tools_dir =
        std::env::var_os("NEURON_TOOLS_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/tools"));
    let path_dirs: Vec<PathBuf> = std::env::var_os("PATH").iter().flat_map(std::env::split_paths).collect();
    // NEURON_K8S_VERSION's control plane and node binaries first (tests/tools/install.sh
    // builds them there), else the default version's.
    let version = std::env::var("NEURON_K8S_VERSION").ok().filter(|v| !v.is_empty());
    let version_dir = version.map(|v| tools_dir.join(format!("k8s-v{v}/bin")));
    version_dir
        .into_iter()
        .chain(std::iter::once(tools_dir.join("bin")))
        .chain(path_dirs)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found in $NEURON_TOOLS_DIR/bin or PATH: run tests/tools/install.sh"))
}

/// A binary of this workspace, from the target directory this test runs from.
pub fn workspace_bin(name: &str) -> PathBuf {
    // The test executable is <target>/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join(name);
    assert!(path.is_file(), "{} is missing: run `cargo build --workspace --bins` first", path.display());
    path
}

/// Starts `command` from a thread that lives until the process exits, with the
/// parent-death signal set to `signal`: the child cannot outlive the test binary.
/// Returns the child's stdout reader.
pub fn spawn_tied(
    mut command: Command,
    signal: libc::c_int,
) -> anyhow::Result<(u32, BufReader<std::process::ChildStdout>)> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("tied-children".to_owned())
        .spawn(move || {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; it only sets the parent-death signal.
            unsafe {
                command.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, signal) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let spawned: Result<Child, std::io::Error> = command.stdout(Stdio::piped()).spawn();
            match spawned {
                Ok(mut child) => {
                    let stdout = child.stdout.take();
                    let _ = tx.send(Ok((child.id(), stdout)));
                    // Keep this thread (the parent of record) alive with the process.
                    let _ = child.wait();
                    loop {
                        std::thread::park();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })
        .context("starting the supervising thread")?;
    let (pid, stdout) = rx.recv().context("supervising thread")??;
    Ok((pid, BufReader::new(stdout.ok_or_else(|| anyhow!("no stdout"))?)))
}

/// What the control plane prints once ready.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ControlPlane {
    pub kubeconfig: PathBuf,
    pub server: String,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    pub controllers: bool,
    pub ready_seconds: f64,
    /// The process (etcd, kube-apiserver and the controllers), for its CPU and memory.
    #[serde(skip)]
    pub pid: u32,
}

static CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static DEVICE_TAINTS_CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The kube-apiserver flags that serve the alpha DeviceTaintRule API
/// (`resource.k8s.io/v1alpha3`) of Kubernetes 1.33 to 1.35; the gate
/// `DRADeviceTaintRules` exists from 1.35 (`NEURON_K8S_VERSION`, as tests/tools/install.sh
/// reads it, names an older control plane).
pub fn device_taint_apiserver_flags() -> Vec<String> {
    let version = std::env::var("NEURON_K8S_VERSION").unwrap_or_default();
    let gates = match version.as_str() {
        "1.33" | "1.34" => "DRADeviceTaints=true",
        _ => "DRADeviceTaints=true,DRADeviceTaintRules=true",
    };
    vec![format!("--feature-gates={gates}"), "--runtime-config=resource.k8s.io/v1alpha3=true".to_owned()]
}

impl ControlPlane {
    /// The control plane of this test binary, started on first use.
    pub fn shared() -> &'static ControlPlane {
        match CONTROL_PLANE.get_or_init(|| Self::start().map_err(|e| format!("{e:#}"))) {
            Ok(cp) => cp,
            Err(e) => panic!("the test control plane did not start: {e}"),
        }
    }

    /// A second control plane of this test binary, serving the alpha DeviceTaintRule API
    /// ([`device_taint_apiserver_flags`]), started on first use; the shared one does not
    /// serve it, as a cluster of Kubernetes 1.33 to 1.35 does not by default.
    pub fn with_device_taints() -> &'static ControlPlane {
        let started = DEVICE_TAINTS_CONTROL_PLANE.get_or_init(|| {
            let flags: Vec<String> =
                device_taint_apiserver_flags().iter().map(|f| format!("--apiserver-arg={f}")).collect();
            Self::start_with(&flags).map_err(|e| format!("{e:#}"))
        });
        match started {
            Ok(cp) => cp,
            Err(e) => panic!("the test control plane with DeviceTaintRules did not start: {e}"),
        }
    }

    fn start() -> anyhow::Result<ControlPlane> {
        Self::start_with(&[])
    }

    fn start_with(args: &[String]) -> anyhow::Result<ControlPlane> {
        let mut command = Command::new(tool("controlplane"));
        command.args(args).stdin(Stdio::null()).stderr(Stdio::inherit());
        let (pid, mut stdout) = spawn_tied(command, libc::SIGTERM)?;
        let mut line = String::new();
        stdout.read_line(&mut line).with_context(|| format!("reading the control plane's (pid {pid}) ready line"))?;
        if line.trim().is_empty() {
            bail!("the control plane (pid {pid}) exited before it was ready; see its log on stderr");
        }
        let mut control_plane: ControlPlane =
            serde_json::from_str(line.trim()).with_context(|| format!("control plane ready line {line:?}"))?;
        control_plane.pid = pid;
        Ok(control_plane)
    }

    fn config(&self) -> anyhow::Result<Kubeconfig> {
        Kubeconfig::read_from(&self.kubeconfig).with_context(|| format!("reading {}", self.kubeconfig.display()))
    }

    /// An administrator (`system:masters`) client.
    pub async fn client(&self) -> Client {
        let config = Config::from_custom_kubeconfig(self.config().expect("kubeconfig"), &KubeConfigOptions::default())
            .await
            .expect("client config");
        Client::try_from(config).expect("client")
    }

    /// A client acting as `user` in `groups` (impersonation), subject to RBAC like a
    /// real caller.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        self.client_as_with_extra(user, groups, &[]).await
    }

    /// A client acting as `user` in `groups` with the user `extra` fields (key, value),
    /// as an authenticator would set them: e.g. what a token bound to a pod carries.
    pub async fn client_as_with_extra(&self, user: &str, groups: &[&str], extra: &[(&str, &str)]) -> Client {
        let mut config =
            Config::from_custom_kubeconfig(self.config().expect("kubeconfig"), &KubeConfigOptions::default())
                .await
                .expect("client config");
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
        if !extra.is_empty() {
            let mut fields: std::collections::HashMap<String, Vec<String>> = Default::default();
            for (key, value) in extra {
                fields.entry((*key).to_owned()).or_default().push((*value).to_owned());
            }
            config.auth_info.impersonate_user_extra = Some(fields);
        }
        Client::try_from(config).expect("client")
    }

    /// A client acting as the ServiceAccount `namespace/name`, with a token bound to
    /// nothing.
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Client {
        let groups = service_account_groups(namespace);
        self.client_as(&service_account_user(namespace, name), &groups.each_ref().map(String::as_str)).await
    }

    /// A client acting as the ServiceAccount `namespace/name` with the token of a pod on
    /// `node`: its user extra names the node ([`NODE_NAME_EXTRA`]), as in every
    /// ServiceAccount token the kubelet mounts in a pod (Kubernetes 1.30 and later).
    pub async fn service_account_client_on_node(&self, namespace: &str, name: &str, node: &str) -> Client {
        let groups = service_account_groups(namespace);
        let groups = groups.each_ref().map(String::as_str);
        self.client_as_with_extra(&service_account_user(namespace, name), &groups, &[(NODE_NAME_EXTRA, node)]).await
    }

    /// Writes a kubeconfig acting as the ServiceAccount `namespace/name` (impersonation by
    /// the administrator), as a pod with that ServiceAccount would: on `node`, its token
    /// names the node in the user extra, as a token the kubelet mounts does.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        node: Option<&str>,
        path: &Path,
    ) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(&self.kubeconfig)?;
        let mut config: serde_norway::Value = serde_norway::from_str(&text)?;
        let users = config["users"].as_sequence_mut().ok_or_else(|| anyhow!("no users in the kubeconfig"))?;
        for user in users {
            let user = user["user"].as_mapping_mut().ok_or_else(|| anyhow!("a kubeconfig user without settings"))?;
            user.insert("as".into(), service_account_user(namespace, name).into());
            user.insert("as-groups".into(), serde_norway::to_value(service_account_groups(namespace))?);
            if let Some(node) = node {
                let extra = serde_json::json!({ NODE_NAME_EXTRA: [node] });
                user.insert("as-user-extra".into(), serde_norway::to_value(extra)?);
            }
        }
        std::fs::write(path, serde_norway::to_string(&config)?).with_context(|| format!("writing {}", path.display()))
    }

    /// A token of the ServiceAccount `namespace/name` (created when missing) from a
    /// TokenRequest, valid an hour, for `audiences` (empty: the API server's), as the
    /// kubelet mounts one in a pod.
    pub async fn service_account_token(&self, namespace: &str, name: &str, audiences: &[&str]) -> String {
        let accounts = Api::<ServiceAccount>::namespaced(self.client().await, namespace);
        if accounts.get_opt(name).await.expect("read the ServiceAccount").is_none() {
            let account = ServiceAccount {
                metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
                ..Default::default()
            };
            accounts.create(&PostParams::default(), &account).await.expect("create the ServiceAccount");
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
                expiration_seconds: Some(3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued =
            accounts.create_token_request(name, &PostParams::default(), &request).await.expect("a TokenRequest");
        issued.status.expect("the TokenRequest's status").token
    }

    /// Creates a namespace of its own for one test: `<prefix>-<random>`.
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = format!("{prefix}-{:08x}", random_u32());
        let ns =
            Namespace { metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() }, ..Default::default() };
        Api::<Namespace>::all(self.client().await).create(&PostParams::default(), &ns).await.expect("create namespace");
        name
    }

    /// Applies the project's CRDs from `crds/` once per test binary and waits until they
    /// are served. Once: every update of a CRD makes the API server rebuild its storage,
    /// which can stall other tests' watches of it.
    pub async fn install_crds(&self) {
        static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        INSTALLED.get_or_init(|| self.apply_crds()).await;
    }

    async fn apply_crds(&self) {
        let client = self.client().await;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let dir = repo_root().join("crds");
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        entries.sort();
        for path in entries {
            let text = std::fs::read_to_string(&path).expect("read CRD");
            let crd: CustomResourceDefinition = serde_norway::from_str(&text).expect("CRD YAML");
            let name = crd.metadata.name.clone().expect("CRD name");
            api.patch(&name, &PatchParams::apply("neuron-e2e").force(), &Patch::Apply(&crd)).await.expect("apply CRD");
            wait_for(Duration::from_secs(30), || async {
                let crd = api.get(&name).await.ok()?;
                let established =
                    crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("CRD {name} not established"));
        }
    }
}

/// The user extra field of a ServiceAccount token bound to a pod that names the pod's node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The user name of the ServiceAccount `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups every ServiceAccount of `namespace` is in.
pub fn service_account_groups(namespace: &str) -> [String; 3] {
    [
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{namespace}"),
        "system:authenticated".to_owned(),
    ]
}

/// Polls `check` every 100 ms until it returns `Some`, or `None` after `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process of the project's own, killed (and reaped) on drop.
pub struct Process {
    pub child: Child,
    pub name: String,
}

impl Process {
    /// Starts a workspace binary with `args` and `env`, talking to `control_plane`.
    pub fn start(binary: &str, args: &[String], env: &[(&str, String)], control_plane: &ControlPlane) -> Process {
        let mut command = Command::new(workspace_bin(binary));
        command
            .args(args)
            .env("KUBECONFIG", &control_plane.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        Process { child, name: binary.to_owned() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// PIDs of this process's children.
    pub fn children(&self) -> Vec<u32> {
        neuron_test_support::child_pids(self.pid())
    }

    /// Sends SIGTERM and waits up to `limit` for the exit status.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: signalling our own child, not yet reaped.
        unsafe {
            libc::kill(self.pid() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The command line of a process, as its arguments.
pub fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default()
}

/// Runs kubectl against the control plane, with `stdin` piped in; returns
/// (success, stdout, stderr).
pub fn kubectl(control_plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&control_plane.kubeconfig)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl is installed");
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).expect("write to kubectl");
    }
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value of an unlabelled sample `name` in an exposition, if present.
pub fn sample(exposition: &str, name: &str) -> Option<f64> {
    exposition.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Whether the server has closed `stream` (end of file or reset) before `deadline`.
pub fn closed_by_server(mut stream: &std::net::TcpStream, deadline: std::time::Instant) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // A refusal may answer 503 before closing.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => return true,
        }
    }
}

/// A TCP connection to `addr` from the loopback address `source` (any of 127.0.0.0/8 on
/// Linux), so that one test can be several peers to a server.
pub fn connect_from(source: std::net::IpAddr, addr: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.bind(&std::net::SocketAddr::new(source, 0).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(2))?;
    Ok(socket.into())
}

/// [`http_get`] from the loopback address `source`.
pub fn http_get_from(source: std::net::IpAddr, addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    neuron_test_support::http_get_on(connect_from(source, addr).ok()?, addr, path)
}
