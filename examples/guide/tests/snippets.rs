//! Every Rust snippet of docs/guide.md and README.md appears in this crate,
//! line by line and in order (blank lines aside, indentation ignored), so a
//! snippet that stops compiling fails the build and one edited without this
//! crate fails this test.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The ```rust blocks of a Markdown file, as trimmed non-blank lines.
fn snippets(markdown: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in markdown.lines() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.starts_with("```rust") => current = Some(Vec::new()),
            Some(block) if fence.starts_with("```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) if !line.trim().is_empty() => block.push(line.trim().to_owned()),
            _ => {}
        }
    }
    blocks
}

/// Every .rs file of this crate, as trimmed non-blank lines.
fn sources() -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let lines = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect();
                files.push((path, lines));
            }
        }
    }
    files
}

/// Whether `needle`'s lines appear in `hay` in order.
fn appears_in_order(needle: &[String], hay: &[String]) -> bool {
    let mut rest = hay.iter();
    needle.iter().all(|line| rest.any(|h| h == line))
}

#[test]
fn every_snippet_of_the_guide_and_the_readme_is_compiled_here() {
    let sources = sources();
    let mut checked = 0;
    for doc in ["docs/guide.md", "README.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for (i, block) in snippets(&text).into_iter().enumerate() {
            let found = sources
                .iter()
                .any(|(_, lines)| appears_in_order(&block, lines));
            assert!(
                found,
                "{doc}, Rust snippet {} is not in examples/guide line for line; \
                 copy it there (with what it needs around it) so it is compiled:\n{}",
                i + 1,
                block.join("\n")
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 9,
        "found only {checked} snippets: is the fence detection broken?"
    );
}

#[test]
fn the_checker_notices_a_changed_line() {
    let hay: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    assert!(appears_in_order(&["a".into(), "c".into()], &hay));
    assert!(!appears_in_order(&["c".into(), "a".into()], &hay));
    assert!(!appears_in_order(&["a".into(), "x".into()], &hay));
}

/// The dependency names of the first ```toml block after `heading`.
fn toml_dependencies(markdown: &str, heading: &str) -> Vec<String> {
    let after = &markdown[markdown.find(heading).expect("the heading")..];
    let block = after
        .split("```toml")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a toml block");
    block
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
        .filter(|k| !k.is_empty() && !k.starts_with('#') && !k.starts_with('['))
        .collect()
}

#[test]
fn this_crate_depends_on_exactly_what_the_readme_installation_lists() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut listed = toml_dependencies(&readme, "## Installation");
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let section = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap();
    let mut ours: Vec<String> = section
        .lines()
        .filter_map(|l| l.split(['=', '.']).next())
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .collect();
    listed.sort();
    ours.sort();
    assert_eq!(
        listed, ours,
        "README's installation section and examples/guide/Cargo.toml differ"
    );
}

#[test]
fn ci_runs_exactly_the_test_command_the_readme_gives() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let command = readme
        .lines()
        .find_map(|l| l.strip_suffix("# the tests"))
        .expect("README's test command, marked `# the tests`")
        .trim();
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(
        ci.contains(&format!("{{ {command}; }}")),
        ".ci/run must run README's test command word for word: {command}"
    );
    // Every install script it names exists.
    for word in command.split_whitespace().filter(|w| w.starts_with(".ci/")) {
        assert!(root().join(word).is_file(), "{word} is missing");
    }
}
