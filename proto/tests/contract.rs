//! The wire contract where executor authors in other languages trip, checked on the
//! compiled descriptor set (the one reflection serves): generator options that work
//! as the Go and Java tools expect, zero values that mean the normal case, every
//! server message about a run naming the whole `RunRef`, and a comment on every
//! message and field of the executor protocol.

use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet, field_descriptor_proto::Type};

/// The Go example's module (`sdk-examples/go/go.mod`) plus the stubs' directory, so
/// `protoc --go_out=. --go_opt=module=<module>` writes them where the module finds them.
const GO_PACKAGE: &str = "github.com/sundial-sched/sundial/sdk-examples/go/gen/sundialv1;sundialv1";

/// Class names in `java.lang`, `java.util` and `java.util.concurrent` that generated
/// outer classes have been seen to clash with (or would, by their file names).
const JAVA_CLASHES: &[&str] = &[
    "Executor", "Job", "Run", "Runnable", "Admin", "Object", "Thread", "Process", "Timer",
    "Record", "Runtime", "Future", "Callable", "Optional", "Map", "List", "Set",
];

fn files() -> Vec<FileDescriptorProto> {
    FileDescriptorSet::decode(sundial_proto::FILE_DESCRIPTOR_SET)
        .expect("the descriptor set decodes")
        .file
        .into_iter()
        .filter(|f| f.package() == "sundial.v1")
        .collect()
}

fn file(name: &str) -> FileDescriptorProto {
    files()
        .into_iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{name} is compiled"))
}

#[test]
fn generator_options_work_for_go_and_java() {
    let files = files();
    assert_eq!(files.len(), 4, "job, run, executor, admin");
    for f in files {
        let o = f.options.clone().expect("file options");
        assert_eq!(o.go_package(), GO_PACKAGE, "{}", f.name());
        assert_eq!(o.java_package(), "dev.sundial.v1", "{}", f.name());
        assert!(o.java_multiple_files(), "{}", f.name());
        let outer = o.java_outer_classname();
        assert!(
            outer.ends_with("Proto") && !JAVA_CLASHES.contains(&outer),
            "{}: java_outer_classname {outer:?} must be set and clash with nothing in java.*",
            f.name()
        );
    }
}

#[test]
fn an_unset_heartbeat_means_ready() {
    let f = file("sundial/v1/executor.proto");
    let hb = f
        .message_type
        .iter()
        .find(|m| m.name() == "Heartbeat")
        .expect("Heartbeat");
    assert!(
        hb.field.iter().all(|x| x.name() != "ready"),
        "a proto3 bool `ready` makes an unset heartbeat NOT_READY"
    );
    let not_ready = hb
        .field
        .iter()
        .find(|x| x.name() == "not_ready")
        .expect("Heartbeat.not_ready");
    assert_eq!(not_ready.r#type(), Type::Bool);
    assert!(
        hb.reserved_name.iter().any(|n| n == "ready"),
        "the old field's name and number stay reserved"
    );
    assert!(
        hb.reserved_range
            .iter()
            .any(|r| r.start() <= 4 && 4 < r.end()),
        "field 4 stays reserved"
    );
    // And in the generated Rust type, the default is a ready heartbeat.
    assert!(!sundial_proto::v1::Heartbeat::default().not_ready);
}

#[test]
fn every_server_message_about_a_run_names_its_whole_run_ref() {
    let f = file("sundial/v1/executor.proto");
    for name in ["StartAck", "ResultAck", "Cancel", "LeaseStatus", "Dispatch"] {
        let m = f
            .message_type
            .iter()
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("{name}"));
        let run = m
            .field
            .iter()
            .find(|x| x.name() == "run")
            .unwrap_or_else(|| panic!("{name}.run"));
        assert_eq!(run.type_name(), ".sundial.v1.RunRef", "{name}.run");
    }
}

#[test]
fn every_executor_message_and_field_is_explained() {
    let f = file("sundial/v1/executor.proto");
    let info = f.source_code_info.clone().expect("source info is kept");
    let commented = |path: &[i32]| {
        info.location.iter().any(|l| {
            l.path == path
                && (l
                    .leading_comments
                    .as_deref()
                    .is_some_and(|c| !c.trim().is_empty())
                    || l.trailing_comments
                        .as_deref()
                        .is_some_and(|c| !c.trim().is_empty()))
        })
    };
    // FileDescriptorProto.message_type = 4, DescriptorProto.field = 2.
    let mut missing = Vec::new();
    for (i, m) in f.message_type.iter().enumerate() {
        let i = i32::try_from(i).expect("few messages");
        // The oneof envelopes are self-explanatory: their fields name the messages.
        let envelope = m.name().ends_with("Message");
        if !envelope && !commented(&[4, i]) {
            missing.push(m.name().to_owned());
        }
        if envelope {
            continue;
        }
        for (j, field) in m.field.iter().enumerate() {
            let j = i32::try_from(j).expect("few fields");
            let self_evident = field.name() == "run" && field.type_name() == ".sundial.v1.RunRef";
            if !self_evident && !commented(&[4, i, 2, j]) {
                missing.push(format!("{}.{}", m.name(), field.name()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "executor.proto leaves these unexplained: {missing:?}"
    );
}
