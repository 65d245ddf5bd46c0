//! Rebuild the programs when the bpf-linker binary changes (it is an
//! undeclared dependency of the bpf target).
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo:warning=bpf-linker not found on PATH ({err}); run `cargo xtask setup`");
            // Where setup installs it: a path that does not exist yet makes
            // cargo run this script again on every build, so the warning
            // (which cargo replays from its cache) goes once it is there.
            let cargo_home = std::env::var_os("CARGO_HOME")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo"))
                });
            if let Some(home) = cargo_home {
                println!(
                    "cargo:rerun-if-changed={}",
                    home.join("bin/bpf-linker").display()
                );
            }
        }
    }
}
