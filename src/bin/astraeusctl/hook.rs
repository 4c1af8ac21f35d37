//! `astraeusctl claim-hook UID`: the CDI `createContainer` hook the kubelet
//! plugin writes into each claim's spec (docs/kubernetes.md). The container
//! runtime runs it as root with the container's OCI state on standard
//! input, after the container's control group is made and before its
//! command runs; it names the container's process to astraeusd, which
//! makes the group the claim's (holders, GPU memory limits) before it
//! answers.
//!
//! A failure fails the container's creation (the kubelet tries again), so
//! a pod never runs unbound because astraeusd was restarting; a second
//! container of a claim already bound is told so and runs (a claim's
//! share is held for one container: its first).

use std::io::Read;

/// The OCI state's size limit: a state is a few hundred bytes.
const MAX_STATE: u64 = 1 << 20;

/// The container's process, from the OCI state (`{"pid": N, ...}`).
pub fn pid_of_state(text: &str) -> Result<u32, String> {
    let state: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("NoInput: standard input: not an OCI state (JSON): {e}"))?;
    state
        .get("pid")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            "NoInput: standard input: the OCI state has no \"pid\" (a process id)".into()
        })
}

pub fn read_state() -> Result<String, String> {
    let mut text = String::new();
    std::io::stdin()
        .take(MAX_STATE)
        .read_to_string(&mut text)
        .map_err(|e| format!("NoInput: standard input: {e}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::pid_of_state;

    #[test]
    fn the_pid_comes_from_the_oci_state() {
        let state =
            r#"{"ociVersion":"1.0.2","id":"c1","status":"created","pid":4242,"bundle":"/b"}"#;
        assert_eq!(pid_of_state(state), Ok(4242));
        for bad in [
            "",
            "{}",
            r#"{"pid":0}"#,
            r#"{"pid":-1}"#,
            r#"{"pid":"7"}"#,
            r#"{"pid":99999999999}"#,
        ] {
            assert!(
                pid_of_state(bad).unwrap_err().starts_with("NoInput: "),
                "{bad}"
            );
        }
    }
}
