//! docs/writing-a-sink.md against the code: its registry example is the
//! real `sinks! { … }` invocation, every sink folder is in it, and the
//! signatures it tells a sink author to write are the code's.

use memwatch_tests::ops::{read, repo};

/// `text` from the line that starts with `open` to the first line that is
/// `close`, both excluded, trimmed lines, blank ones left out.
fn block(text: &str, open: &str, close: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(open));
    assert!(lines.next().is_some(), "`{open}` not found");
    lines
        .take_while(|l| *l != close)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Whitespace collapsed, so that a signature wrapped by rustfmt compares
/// equal to the guide's one-liner.
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn guide() -> String {
    read("docs/writing-a-sink.md")
}

#[test]
fn the_guide_s_registry_example_is_the_real_registry() {
    let code = block(&read("agent/src/sinks/mod.rs"), "sinks! {", "}");
    let guide = guide();
    let section = guide
        .split_once("## 3. The registry line")
        .expect("the guide's registry section")
        .1;
    let example = block(section, "sinks! {", "}");
    assert!(code.len() >= 6, "registry lines not found: {code:?}");
    assert_eq!(
        example, code,
        "docs/writing-a-sink.md, section 3, must show agent/src/sinks/mod.rs's sinks! {{ … }} as it is"
    );
    // A single-table line after `;` and an attribute line are both shown.
    assert!(code.iter().any(|l| l.ends_with(';')), "{code:?}");
    assert!(code.iter().any(|l| l.starts_with("#[cfg(")), "{code:?}");
}

#[test]
fn every_sink_folder_is_registered() {
    let registry = read("agent/src/sinks/mod.rs");
    let lines = block(&registry, "sinks! {", "}");
    let dir = repo().join("agent/src/sinks");
    let mut folders = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.join("mod.rs").is_file() {
            folders.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(folders.len() >= 6, "{folders:?}");
    for sink in &folders {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("\"{sink}\" =>"))),
            "agent/src/sinks/{sink}/ has no line in the registry: {lines:?}"
        );
        assert!(
            registry.contains(&format!("pub(crate) mod {sink};")),
            "agent/src/sinks/mod.rs does not declare `mod {sink}`"
        );
    }
}

#[test]
fn the_guide_s_signatures_are_the_code_s() {
    let guide = squash(&guide());
    let registry = squash(&read("agent/src/sinks/mod.rs"));
    // (what the guide shows, where the code has it, what the code says)
    let pairs: &[(&str, &str, &str)] = &[
        (
            "fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started>",
            "agent/src/sinks/mod.rs",
            "fn start(&self, ctx: &SinkContext) -> anyhow::Result<Started>;",
        ),
        (
            "Started::tasks(",
            "agent/src/sinks/mod.rs",
            "pub(crate) fn tasks(tasks: Vec<JoinHandle<()>>) -> Self",
        ),
        (
            ".enricher(",
            "agent/src/sinks/mod.rs",
            "pub(crate) fn enricher(mut self, enricher: Arc<dyn Enrich>) -> Self",
        ),
        (
            ".on_register(",
            "agent/src/sinks/mod.rs",
            "pub(crate) fn on_register(mut self, hook: Arc<dyn OnRegister>) -> Self",
        ),
        (
            "Start::check_workers",
            "agent/src/sinks/mod.rs",
            "fn check_workers( &self, _index: usize, _declared: &dyn Fn(&str) -> bool, ) -> Result<(), InvalidKey>",
        ),
        (
            "from_table(mut table: SinkTable) -> Result<Self, InvalidKey>",
            "agent/src/sinks/webhook/config.rs",
            "pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey>",
        ),
        (
            "from_single(SinkTable) -> Result<Option<Self>, InvalidKey>",
            "agent/src/sinks/kubernetes/config.rs",
            "pub(crate) fn from_single(mut table: SinkTable) -> Result<Option<Self>, InvalidKey>",
        ),
        (
            "LEFT_OUT",
            "agent/src/sinks/mod.rs",
            "pub(crate) const LEFT_OUT: &[(&str, &str)]",
        ),
        (
            "model::event::Enrich",
            "agent/src/model/event.rs",
            "pub(crate) trait Enrich",
        ),
    ];
    for (shown, file, code) in pairs {
        assert!(
            guide.contains(&squash(shown)),
            "docs/writing-a-sink.md no longer shows `{shown}`"
        );
        let text = if *file == "agent/src/sinks/mod.rs" {
            registry.clone()
        } else {
            squash(&read(file))
        };
        assert!(
            text.contains(&squash(code)),
            "{file} no longer has `{code}`: docs/writing-a-sink.md shows `{shown}`; make them agree"
        );
    }
    // The claim the layer check enforces is made, and the old false one gone.
    assert!(guide.contains("no module of the agent names a sink"));
    assert!(!guide.contains("Nothing else in the agent names a sink"));
}
