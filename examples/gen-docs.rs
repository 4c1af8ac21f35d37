//! Writes the man pages (astraeusd.8, astraeusctl.1) and the bash, zsh and
//! fish completions into DIR, from the same clap definitions the binaries
//! use. The packaging script runs it: `cargo run --example gen-docs -- DIR`.

use astraeusd::cli::{CtlArgs, DaemonArgs};
use clap::CommandFactory;
use clap_complete::Shell;
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
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
    println!("wrote man pages and completions to {}", dir.display());
    Ok(())
}
