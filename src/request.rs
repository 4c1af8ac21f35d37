//! The worker request, parsed from the seed's JSON and validated field by field.
//!
//! Parsing walks a `serde_json::Value` by hand instead of deriving, so that every
//! error names its field path and what would be accepted, unknown fields are
//! refused, and `memory_gb` is checked on the number's own text (the crate is
//! built with serde_json's `arbitrary_precision`, which keeps that text).

use crate::error::{Error, Result};
use crate::json_fields::{
    boolean, document, list, object, parse_text, required, short, string, strings, uint,
};
use crate::quantity::{Amount, AmountError};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Largest request text accepted; a worker spec is a few hundred bytes.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
/// Longest list accepted in a request (models, ids, command, env, holders).
pub use crate::json_fields::MAX_LIST;
/// Longest single string accepted (a domain XML is the biggest legitimate one).
pub use crate::json_fields::MAX_STRING;
/// Most holders a worker may name: a program and a few of its helpers. The
/// daemon checks each one's identity at a submit and its liveness at every
/// refresh (off the loop, but still two reads of /proc each).
pub const MAX_HOLDERS: usize = 32;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerSpec {
    pub name: String,
    pub resources: Resources,
    pub run: Option<Run>,
    /// Pids whose GPU memory counts as this worker's (reservations); empty
    /// means none (the caller's own pid is never a default holder).
    pub holders: Vec<u32>,
    /// The Kubernetes claim it books (a worker PrepareClaim made: claim.rs);
    /// SubmitWorker refuses a request that names one.
    pub claim: Option<crate::claim::Origin>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    pub cpu_cores: Amount,
    pub memory_bytes: u64,
    pub gpu: Option<GpuRequest>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuRequest {
    pub count: GpuCount,
    /// `Some(share)` for shared work: the GB it takes on each GPU.
    pub shared_gb: Option<Amount>,
    pub vendor: Option<String>,
    pub models: Vec<String>,
    pub ids: Vec<GpuId>,
    pub healthy_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GpuCount {
    Exactly(u32),
    /// `policy: "All"`: every GPU of the machine that matches the filters.
    All,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum GpuId {
    Index(u32),
    Uuid(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Run {
    Container {
        image: String,
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
    Unit {
        exec: Vec<String>,
        env: BTreeMap<String, String>,
    },
    Vm(VmSource),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum VmSource {
    Domain(String),
    DomainXml(String),
}

/// Worker and template names: 1–64 of `A-Z a-z 0-9 _ . -`, starting with a
/// letter or digit, so they map onto object paths, unit and domain names.
pub fn validate_name(path: &str, name: &str) -> Result<()> {
    let ok_first = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let ok_rest = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if name.is_empty() || name.len() > 64 || !ok_first || !ok_rest {
        return Err(Error::field(
            path,
            "1 to 64 characters of A-Z a-z 0-9 _ . - starting with a letter or digit",
        ));
    }
    Ok(())
}

impl WorkerSpec {
    pub fn parse(text: &str) -> Result<WorkerSpec> {
        let value = parse_text(text, "request", MAX_SPEC_BYTES)?;
        WorkerSpec::from_value(&value)
    }

    pub fn from_value(value: &Value) -> Result<WorkerSpec> {
        let top = document(
            value,
            "request",
            &["name", "requested_resources", "run", "holders", "claim"],
        )?;
        let name = string(required(top, "", "name")?, "name")?;
        validate_name("name", &name)?;
        let resources = match top.get("requested_resources") {
            Some(v) => parse_resources(v)?,
            None => Resources::default(),
        };
        let run = top.get("run").map(parse_run).transpose()?;
        let holders = match top.get("holders") {
            None => Vec::new(),
            Some(v) => list(v, "holders")?
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let path = format!("holders[{i}]");
                    let pid = uint(p, &path)?;
                    u32::try_from(pid)
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| Error::field(&path, "a process id (1 to 4294967295)"))
                })
                .collect::<Result<_>>()?,
        };
        if holders.len() > MAX_HOLDERS {
            return Err(Error::field(
                "holders",
                format!(
                    "{} processes is too many; at most {MAX_HOLDERS}",
                    holders.len()
                ),
            ));
        }
        if let Some(i) = (1..holders.len()).find(|&i| holders[..i].contains(&holders[i])) {
            return Err(Error::field(
                &format!("holders[{i}]"),
                format!("process {} is named already; each process once", holders[i]),
            ));
        }
        if let (Some(Run::Vm(_)), Some(gpu)) = (&run, &resources.gpu) {
            if gpu.shared_gb.is_some() {
                return Err(Error::field(
                    "run.vm",
                    "a VM takes its GPUs whole; shared cannot be used with a vm run",
                ));
            }
        }
        let claim = match top.get("claim") {
            None => None,
            Some(v) => {
                let c = object(v, "claim", &["namespace", "name", "uid"])?;
                let part = |k: &str| short(required(c, "claim", k)?, &format!("claim.{k}"));
                Some(crate::claim::Origin {
                    namespace: part("namespace")?,
                    name: part("name")?,
                    uid: part("uid")?,
                })
            }
        };
        Ok(WorkerSpec {
            name,
            resources,
            run,
            holders,
            claim,
        })
    }

    /// The share per GPU when the worker shares by memory.
    pub fn shared_gb(&self) -> Option<Amount> {
        self.resources.gpu.as_ref().and_then(|g| g.shared_gb)
    }
}

const GPU_PATH: &str = "requested_resources.gpu_requests";

fn parse_resources(v: &Value) -> Result<Resources> {
    let path = "requested_resources";
    let m = object(v, path, &["cpu_cores", "memory_bytes", "gpu_requests"])?;
    let cpu_cores = match m.get("cpu_cores") {
        None => Amount::ZERO,
        Some(v) => amount(v, "requested_resources.cpu_cores", false)?,
    };
    let memory_bytes = match m.get("memory_bytes") {
        None => 0,
        Some(v) => uint(v, "requested_resources.memory_bytes")?,
    };
    let gpu = m.get("gpu_requests").map(parse_gpu).transpose()?;
    Ok(Resources {
        cpu_cores,
        memory_bytes,
        gpu,
    })
}

fn parse_gpu(v: &Value) -> Result<GpuRequest> {
    let m = object(
        v,
        GPU_PATH,
        &[
            "count",
            "shared",
            "memory_gb",
            "vendor",
            "models",
            "healthy_only",
            "ids",
            "policy",
        ],
    )?;
    let p = |f: &str| format!("{GPU_PATH}.{f}");
    let shared = match m.get("shared") {
        None => false,
        Some(v) => boolean(v, &p("shared"))?,
    };
    let all = match m.get("policy") {
        None => false,
        Some(Value::String(s)) if s == "All" => true,
        Some(Value::String(s)) if s == "Count" => false,
        Some(_) => {
            return Err(Error::field(
                &p("policy"),
                "\"All\" (every GPU) or \"Count\" (the default: count GPUs)",
            ))
        }
    };
    if all && shared {
        return Err(Error::field(&p("policy"), "All cannot be shared"));
    }
    let count = match (m.get("count"), all) {
        (Some(_), true) => {
            return Err(Error::field(
                &p("count"),
                "not used with policy All, which takes every GPU; remove one of them",
            ))
        }
        (None, true) => GpuCount::All,
        (None, false) => GpuCount::Exactly(1),
        (Some(v), false) => {
            let n = uint(v, &p("count"))?;
            match u32::try_from(n) {
                Ok(n) if (1..=1024).contains(&n) => GpuCount::Exactly(n),
                _ => return Err(Error::field(&p("count"), "a whole number from 1 to 1024")),
            }
        }
    };
    let shared_gb = match (m.get("memory_gb"), shared) {
        (None, true) => {
            return Err(Error::field(
                &p("memory_gb"),
                "required when shared is true",
            ))
        }
        (Some(_), false) => {
            return Err(Error::field(
                &p("memory_gb"),
                "only allowed with shared: true",
            ))
        }
        (None, false) => None,
        (Some(v), true) => Some(amount(v, &p("memory_gb"), true)?),
    };
    let vendor = m
        .get("vendor")
        .map(|v| short(v, &p("vendor")))
        .transpose()?;
    let models = match m.get("models") {
        None => Vec::new(),
        Some(v) => list(v, &p("models"))?
            .iter()
            .enumerate()
            .map(|(i, s)| short(s, &format!("{}[{i}]", p("models"))))
            .collect::<Result<_>>()?,
    };
    let ids = match m.get("ids") {
        None => Vec::new(),
        Some(v) => list(v, &p("ids"))?
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let path = format!("{}[{i}]", p("ids"));
                match id {
                    // What NVML's UUIDs are made of (a GPU's, or a MIG
                    // instance's: "MIG-…"), and nothing that could reach a
                    // reason ("no GPU GPU-…") as anything else.
                    Value::String(s)
                        if (s.starts_with("GPU-") || s.starts_with("MIG-"))
                            && s.len() <= 128
                            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
                    {
                        Ok(GpuId::Uuid(s.clone()))
                    }
                    Value::Number(_) => u32::try_from(uint(id, &path)?)
                        .map(GpuId::Index)
                        .map_err(|_| Error::field(&path, "a GPU index or a UUID")),
                    _ => Err(Error::field(
                        &path,
                        "a GPU index (0, 1, …) or a UUID (\"GPU-\" or \"MIG-\" then letters, \
                         digits and dashes; at most 128)",
                    )),
                }
            })
            .collect::<Result<_>>()?,
    };
    let healthy_only = match m.get("healthy_only") {
        None => true,
        Some(v) => boolean(v, &p("healthy_only"))?,
    };
    Ok(GpuRequest {
        count,
        shared_gb,
        vendor,
        models,
        ids,
        healthy_only,
    })
}

fn parse_run(v: &Value) -> Result<Run> {
    let m = object(v, "run", &["container", "unit", "vm"])?;
    if m.len() != 1 {
        return Err(Error::field("run", "exactly one of container, unit or vm"));
    }
    let (kind, body) = m.iter().next().expect("one entry");
    let path = format!("run.{kind}");
    match kind.as_str() {
        "container" => {
            let c = object(body, &path, &["image", "command", "env"])?;
            let image = string(required(c, &path, "image")?, "run.container.image")?;
            if image.is_empty() {
                return Err(Error::field(
                    "run.container.image",
                    "an image name such as localhost/bb",
                ));
            }
            Ok(Run::Container {
                image,
                command: strings(c.get("command"), "run.container.command")?,
                env: env(c.get("env"), "run.container.env")?,
            })
        }
        "unit" => {
            let u = object(body, &path, &["exec", "env"])?;
            let exec = strings(Some(required(u, &path, "exec")?), "run.unit.exec")?;
            // What systemd takes as an executable's path, checked here: its
            // refusal would come after the worker was placed, quoting it.
            let valid_path = |p: &str| {
                p.starts_with('/')
                    && p.len() < 4096
                    && p.split('/').all(|c| c.len() <= 255)
                    && !p.chars().any(crate::text::hidden)
            };
            if !exec.first().is_some_and(|p| valid_path(p)) {
                return Err(Error::field(
                    "run.unit.exec[0]",
                    "an absolute path (under 4096 bytes, each part at most 255, no control \
                     characters), then its arguments",
                ));
            }
            Ok(Run::Unit {
                exec,
                env: env(u.get("env"), "run.unit.env")?,
            })
        }
        "vm" => {
            let d = object(body, &path, &["domain", "domain_xml"])?;
            match (d.get("domain"), d.get("domain_xml")) {
                (Some(name), None) => {
                    let name = string(name, "run.vm.domain")?;
                    validate_name("run.vm.domain", &name)?;
                    Ok(Run::Vm(VmSource::Domain(name)))
                }
                (None, Some(xml)) => {
                    let xml = string(xml, "run.vm.domain_xml")?;
                    crate::domain_xml::check(&xml, "run.vm.domain_xml")?;
                    Ok(Run::Vm(VmSource::DomainXml(xml)))
                }
                _ => Err(Error::field(
                    "run.vm",
                    "exactly one of domain (an existing domain's name) or domain_xml",
                )),
            }
        }
        _ => unreachable!("object() admits only known keys"),
    }
}

fn env(v: Option<&Value>, path: &str) -> Result<BTreeMap<String, String>> {
    let Some(v) = v else {
        return Ok(BTreeMap::new());
    };
    let m = v
        .as_object()
        .ok_or_else(|| Error::field(path, "expected an object of NAME: \"value\""))?;
    if m.len() > MAX_LIST {
        return Err(Error::field(path, format!("at most {MAX_LIST} variables")));
    }
    let mut out = BTreeMap::new();
    for (k, val) in m {
        let valid = k.len() <= 128
            && k.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Error::field(
                path,
                "variable names are letters, digits and _, not starting with a digit",
            ));
        }
        if k.starts_with("ASTRAEUS_") {
            return Err(Error::field(
                &format!("{path}.{k}"),
                "ASTRAEUS_* variables are set by the daemon",
            ));
        }
        out.insert(k.clone(), string(val, &format!("{path}.{k}"))?);
    }
    Ok(out)
}

/// An exact amount from a JSON number's own text.
fn amount(v: &Value, path: &str, positive: bool) -> Result<Amount> {
    let Value::Number(n) = v else {
        return Err(Error::field(path, "expected a number such as 2.5"));
    };
    let text = n.to_string();
    if text.starts_with('-') {
        let what = if positive {
            "greater than 0"
        } else {
            "0 or more"
        };
        return Err(Error::field(path, format!("must be {what}")));
    }
    let a = Amount::parse(&text).map_err(|e| match e {
        AmountError::TooManyDecimals => Error::field(path, "at most 2 decimals (e.g. 2.25)"),
        other => Error::field(path, format!("{other}")),
    })?;
    if positive && a.is_zero() {
        return Err(Error::field(path, "must be greater than 0"));
    }
    if a > Amount::whole(1_000_000) {
        return Err(Error::field(path, "at most 1000000"));
    }
    Ok(a)
}

/// The request with `run.<kind>.env` values replaced, for callers other than
/// the owner and root (env often carries tokens).
pub fn redact_env(spec: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(spec) else {
        return String::new();
    };
    if let Some(run) = v.get_mut("run").and_then(|r| r.as_object_mut()) {
        for body in run.values_mut() {
            if let Some(env) = body.get_mut("env").and_then(|e| e.as_object_mut()) {
                for val in env.values_mut() {
                    *val = serde_json::Value::String("(hidden)".into());
                }
            }
        }
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim's worker reads back as the claim it books (claim.rs).
    #[test]
    fn a_claims_request_reads_back_pinned_to_its_gpu() {
        let gpu = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000";
        let uid = "5f0c1e2a-8b3d-4c6e-9f10-1a2b3c4d5e6f";
        let c = crate::claim::Claim::new(uid, "team-a", "voice", gpu, 6 << 28).unwrap();
        let spec = WorkerSpec::parse(&c.spec()).unwrap();
        assert_eq!(spec.name, format!("claim-{uid}"));
        assert_eq!(spec.shared_gb().unwrap().to_string(), "1.5");
        assert_eq!(spec.claim.as_ref(), Some(&c.origin));
        let whole = crate::claim::Claim::new(uid, "team-a", "train", gpu, 0).unwrap();
        assert_eq!(WorkerSpec::parse(&whole.spec()).unwrap().shared_gb(), None);
    }

    /// What a request may hold is checked again at every start: an older
    /// build's ledger must parse (a zero-width space is shown as `?`, not
    /// refused).
    #[test]
    fn a_stored_request_with_an_invisible_character_parses_again() {
        let stored =
            r#"{"name":"x","requested_resources":{"gpu_requests":{"models":["L4\u200b"]}}}"#;
        assert!(WorkerSpec::parse(stored).is_ok());
    }

    #[test]
    fn env_values_are_hidden_from_others() {
        let spec = r#"{"name":"w","run":{"container":{"image":"x","env":{"TOKEN":"s3cret"}}}}"#;
        let r = redact_env(spec);
        assert!(!r.contains("s3cret"));
        assert!(r.contains(r#""TOKEN":"(hidden)""#));
    }

    fn err(text: &str) -> String {
        match WorkerSpec::parse(text) {
            Err(Error::InvalidRequest(m)) => m,
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_seed_request() {
        let s = WorkerSpec::parse(
            r#"{"name":"listen","requested_resources":{"cpu_cores":2,"memory_bytes":4294967296,
                "gpu_requests":{"count":1,"shared":true,"memory_gb":2.5}}}"#,
        )
        .unwrap();
        assert_eq!(s.name, "listen");
        assert_eq!(s.resources.cpu_cores, Amount::whole(2));
        assert_eq!(s.resources.memory_bytes, 4294967296);
        let g = s.resources.gpu.unwrap();
        assert_eq!(g.count, GpuCount::Exactly(1));
        assert_eq!(g.shared_gb, Some(Amount::from_hundredths(250)));
        assert!(g.healthy_only);
    }

    #[test]
    fn every_error_names_its_field() {
        let gpu =
            |g: &str| format!(r#"{{"name":"w","requested_resources":{{"gpu_requests":{g}}}}}"#);
        assert_eq!(
            err(&gpu(r#"{"shared":true}"#)),
            "requested_resources.gpu_requests.memory_gb: required when shared is true"
        );
        assert_eq!(
            err(&gpu(r#"{"memory_gb":2}"#)),
            "requested_resources.gpu_requests.memory_gb: only allowed with shared: true"
        );
        assert_eq!(
            err(&gpu(r#"{"policy":"All","shared":true,"memory_gb":2}"#)),
            "requested_resources.gpu_requests.policy: All cannot be shared"
        );
        assert_eq!(
            err(&gpu(r#"{"count":0}"#)),
            "requested_resources.gpu_requests.count: a whole number from 1 to 1024"
        );
        assert_eq!(
            err(&gpu(r#"{"shared":true,"memory_gb":0}"#)),
            "requested_resources.gpu_requests.memory_gb: must be greater than 0"
        );
        assert_eq!(
            err(&gpu(r#"{"shared":true,"memory_gb":-1.5}"#)),
            "requested_resources.gpu_requests.memory_gb: must be greater than 0"
        );
        assert_eq!(
            err(&gpu(r#"{"shared":true,"memory_gb":2.005}"#)),
            "requested_resources.gpu_requests.memory_gb: at most 2 decimals (e.g. 2.25)"
        );
        assert_eq!(
            err(&gpu(r#"{"shared":true,"memory_gb":"2"}"#)),
            "requested_resources.gpu_requests.memory_gb: expected a number such as 2.5"
        );
        assert!(err(&gpu(r#"{"colour":"red"}"#)).starts_with(
            "requested_resources.gpu_requests.colour: unknown field; accepted here: count"
        ));
        assert!(err(r#"{"name":"w","extra":1}"#).starts_with("extra: unknown field"));
        assert_eq!(
            err(
                r#"{"name":"w","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2}},"run":{"vm":{"domain":"d"}}}"#
            ),
            "run.vm: a VM takes its GPUs whole; shared cannot be used with a vm run"
        );
        assert_eq!(err(r#"{"requested_resources":{}}"#), "name: required");
        // Text another user reads back in a reason or a table: only what
        // such a field is made of, no escapes, line breaks or turned text.
        let ids = |id: &str| gpu(&format!(r#"{{"ids":[{id}]}}"#));
        let bad_id = "requested_resources.gpu_requests.ids[0]: a GPU index (0, 1, …) or a UUID \
                      (\"GPU-\" or \"MIG-\" then letters, digits and dashes; at most 128)";
        for id in [
            r#""GPU-\u001b]0;pwned\u0007""#,
            r#""GPU-1\nrootjob  running""#,
            r#""GPU-\u202ex""#,
            r#""GPU-a b""#,
        ] {
            assert_eq!(err(&ids(id)), bad_id, "{id}");
        }
        assert!(WorkerSpec::parse(&ids(r#""GPU-2f1a9c3e-77b0-4d5e-9a61-0c1d2e3f4a5b""#)).is_ok());
        // A MIG instance's UUID, as NVML gives it (pinned by a claim, or a person).
        assert!(WorkerSpec::parse(&ids(r#""MIG-2f1a9c3e-77b0-4d5e-9a61-0c1d2e3f4a5b""#)).is_ok());
        assert_eq!(err(&ids(r#""MIG-\u202ex""#)), bad_id);
        let models = |m: &str| gpu(&format!(r#"{{"models":[{m}]}}"#));
        for m in [
            r#""4060\u202e""#,
            r#""a\u2028b""#,
            r#""\u2066x""#,
            r#""a\u009bb""#,
        ] {
            assert_eq!(
                err(&models(m)),
                "requested_resources.gpu_requests.models[0]: 1 to 128 printable characters",
                "{m}"
            );
        }
    }

    #[test]
    fn names_are_checked() {
        for bad in [
            "",
            "-lead",
            "has space",
            "a/b",
            "ü",
            &"x".repeat(65),
            "nul\u{0}",
        ] {
            let text = serde_json::json!({ "name": bad }).to_string();
            let m = err(&text);
            assert!(m.starts_with("name: "), "{bad:?} gave {m}");
        }
        for good in ["a", "listen", "voice-2.large_x", &"x".repeat(64)] {
            let text = serde_json::json!({ "name": good }).to_string();
            assert_eq!(WorkerSpec::parse(&text).unwrap().name, good);
        }
    }

    #[test]
    fn runs_are_checked_in_shape() {
        let base = |run: &str| format!(r#"{{"name":"w","run":{run}}}"#);
        let ok = WorkerSpec::parse(&base(
            r#"{"container":{"image":"localhost/bb","command":["sh","-c","true"],"env":{"K":"V"}}}"#,
        ))
        .unwrap();
        assert!(matches!(ok.run, Some(Run::Container { .. })));
        assert_eq!(
            err(&base(r#"{"container":{"command":[]}}"#)),
            "run.container.image: required"
        );
        let exec_err = "run.unit.exec[0]: an absolute path (under 4096 bytes, each part at most \
                        255, no control characters), then its arguments";
        for bad in [
            "whisper".to_string(),
            format!("/{}", "a".repeat(256)),
            format!("/a{}", "/b".repeat(2048)),
            "/bin/x\u{1b}]0;owned\u{7}".to_string(),
        ] {
            let run = serde_json::json!({"unit": {"exec": [bad]}}).to_string();
            assert_eq!(err(&base(&run)), exec_err, "{bad:?}");
        }
        let long_ok = format!("/{}/x", "a".repeat(255));
        let run = serde_json::json!({"unit": {"exec": [long_ok]}}).to_string();
        assert!(WorkerSpec::parse(&base(&run)).is_ok());
        assert_eq!(
            err(&base(r#"{"vm":{}}"#)),
            "run.vm: exactly one of domain (an existing domain's name) or domain_xml"
        );
        assert_eq!(
            err(&base(
                r#"{"container":{"image":"x"},"unit":{"exec":["/bin/true"]}}"#
            )),
            "run: exactly one of container, unit or vm"
        );
        assert_eq!(
            err(&base(
                r#"{"container":{"image":"x","env":{"ASTRAEUS_GPU_MEMORY_GB":"9"}}}"#
            )),
            "run.container.env.ASTRAEUS_GPU_MEMORY_GB: ASTRAEUS_* variables are set by the daemon"
        );
        assert_eq!(
            err(&base(r#"{"container":{"image":"x","command":["a",1]}}"#)),
            "run.container.command[1]: expected a string"
        );
    }

    #[test]
    fn oversized_input_is_refused() {
        let big = format!(r#"{{"name":"{}"}}"#, "x".repeat(MAX_SPEC_BYTES));
        assert!(err(&big).starts_with("request: "));
        let many: Vec<u32> = (1..=1000).collect();
        let text = serde_json::json!({"name":"w","holders": many}).to_string();
        assert_eq!(
            err(&text),
            "holders: 1000 elements is too many; at most 256"
        );
        let many: Vec<u32> = (1..=33).collect();
        let text = serde_json::json!({"name":"w","holders": many}).to_string();
        assert_eq!(err(&text), "holders: 33 processes is too many; at most 32");
        let text = serde_json::json!({"name":"w","holders": [7, 8, 7]}).to_string();
        assert_eq!(
            err(&text),
            "holders[2]: process 7 is named already; each process once"
        );
        let text = serde_json::json!({"name":"w","holders": (1..=32).collect::<Vec<u32>>()});
        assert!(WorkerSpec::parse(&text.to_string()).is_ok());
    }
}
