//! Which container engine runs container workers (podman or Docker Engine,
//! as `runtime.containers` says) and its [`Runtime`] built from the
//! configuration: the implementations are podman.rs and docker.rs.

use super::{docker, http, podman, Runtime};
use std::time::Duration;

/// A container engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerRuntime {
    Podman,
    Docker,
}

impl ContainerRuntime {
    /// As the ledger records it (`Store::container_engine`).
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::Podman => "podman",
            ContainerRuntime::Docker => "docker",
        }
    }

    pub fn parse(text: &str) -> Option<ContainerRuntime> {
        match text {
            "podman" => Some(ContainerRuntime::Podman),
            "docker" => Some(ContainerRuntime::Docker),
            _ => None,
        }
    }
}

/// The engine that runs container workers, as `runtime.containers` says,
/// how the log says it ("Docker at /var/run/docker.sock"), and which.
/// `auto` takes the one whose socket answers now, podman first; with
/// neither, podman (a socket-activated or later-started podman is then
/// used, and a launch before it answers fails naming it). But where
/// container workers of the ledger live (`live_under`: the engine they
/// were started through), `auto` keeps that engine, answering or not: a
/// podman restarting as the daemon starts must not send the restart's
/// reconciling to Docker, which would find none of them and end workers
/// whose containers still run.
pub async fn containers(
    config: &crate::config::RuntimeConfig,
    wsl: bool,
    live_under: Option<ContainerRuntime>,
) -> (std::sync::Arc<dyn Runtime>, String, ContainerRuntime) {
    use crate::config::ContainerEngine;
    let make = |engine: ContainerRuntime| -> (std::sync::Arc<dyn Runtime>, String) {
        // SAFETY: geteuid cannot fail.
        let own_uid = unsafe { libc::geteuid() };
        match engine {
            ContainerRuntime::Podman => (
                std::sync::Arc::new(podman::Podman {
                    socket: config.podman_socket.clone(),
                    cdi_device: config.cdi_device.clone(),
                    answer_within: Duration::from_secs(config.podman_timeout_seconds),
                    own_uid,
                }),
                format!("podman at {}", config.podman_socket.display()),
            ),
            ContainerRuntime::Docker => (
                std::sync::Arc::new(docker::Docker {
                    socket: config.docker_socket.clone(),
                    cdi_device: config.cdi_device.clone(),
                    wsl,
                    answer_within: Duration::from_secs(config.docker_timeout_seconds),
                    own_uid,
                }),
                format!("Docker at {}", config.docker_socket.display()),
            ),
        }
    };
    let (podman_at, docker_at) = (
        config.podman_socket.display(),
        config.docker_socket.display(),
    );
    let (engine, why) = match (config.containers, live_under) {
        (ContainerEngine::Podman, _) => (
            ContainerRuntime::Podman,
            "runtime.containers = \"podman\"".into(),
        ),
        (ContainerEngine::Docker, _) => (
            ContainerRuntime::Docker,
            "runtime.containers = \"docker\"".into(),
        ),
        (ContainerEngine::Auto, Some(engine)) => (
            engine,
            "auto: the ledger's live container workers were started through it".into(),
        ),
        (ContainerEngine::Auto, None) => {
            let limit = Duration::from_secs(2);
            if http::pings(&config.podman_socket, limit).await {
                (ContainerRuntime::Podman, "auto: podman answers".to_string())
            } else if http::pings(&config.docker_socket, limit).await {
                let why = format!("auto: podman does not answer at {podman_at}, Docker does");
                (ContainerRuntime::Docker, why)
            } else {
                let why = format!("auto: neither podman nor Docker at {docker_at} answers yet");
                (ContainerRuntime::Podman, why)
            }
        }
    };
    let (rt, by) = make(engine);
    tracing::info!("container workers run through {by} ({why})");
    (rt, by, engine)
}
