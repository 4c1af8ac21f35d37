//! Writes the man pages (astraeusd.8, astraeusctl.1, node.toml.5) and the bash, zsh and
//! fish completions into DIR, from the same clap definitions the binaries
//! use. The packaging script runs it: `cargo run --example gen-docs -- DIR`.

use astraeusd::cli::{CtlArgs, DaemonArgs};
use clap::CommandFactory;
use clap_complete::Shell;
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("--config-markdown") {
        print!(
            "{}",
            astraeusd::config_doc::markdown(astraeusd::config_doc::EXAMPLE)
        );
        return Ok(());
    }
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "target/docs".into()),
    );
    std::fs::create_dir_all(dir.join("man"))?;
    std::fs::create_dir_all(dir.join("completions"))?;
    for (cmd, section) in [(DaemonArgs::command(), "8"), (CtlArgs::command(), "1")] {
        let name = cmd.get_name().to_string();
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone())
            .section(section)
            .render(&mut out)?;
        std::fs::write(dir.join("man").join(format!("{name}.{section}")), out)?;
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut cmd = cmd.clone();
            clap_complete::generate_to(shell, &mut cmd, &name, dir.join("completions"))?;
        }
    }
    // node.toml(5), from the example config that ships (docs/operations.md
    // holds the same reference as a table: `gen-docs --config-markdown`).
    std::fs::write(
        dir.join("man").join("node.toml.5"),
        astraeusd::config_doc::man(astraeusd::config_doc::EXAMPLE, env!("CARGO_PKG_VERSION")),
    )?;
    println!("wrote man pages and completions to {}", dir.display());
    Ok(())
}
