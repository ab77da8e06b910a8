//! The canonical JSON mapping of the `sundial.v1` messages (pbjson): what grpcurl
//! prints and accepts is what the REST edge will speak. lowerCamelCase out, both
//! spellings in, enums by name, 64-bit integers as strings, bytes as base64.

use sundial_proto::v1 as pb;

#[test]
fn job_requests_read_both_spellings_and_enum_names() {
    let camel = r#"{"spec": {"id": "hello", "cron": "* * * * * *",
        "executor": {"group": "demo", "handler": "hello"}, "payload": "d29ybGQ=",
        "callbackUrl": "https://example.com/hook", "routeStrategy": "ROUTE_STRATEGY_LEAST_ACTIVE",
        "timeoutMs": "30000"}}"#;
    let snake = r#"{"spec": {"id": "hello", "cron": "* * * * * *",
        "executor": {"group": "demo", "handler": "hello"}, "payload": "d29ybGQ=",
        "callback_url": "https://example.com/hook", "route_strategy": "ROUTE_STRATEGY_LEAST_ACTIVE",
        "timeout_ms": 30000}}"#;
    let a: pb::CreateJobRequest = serde_json::from_str(camel).expect("camelCase");
    let b: pb::CreateJobRequest = serde_json::from_str(snake).expect("snake_case");
    assert_eq!(a, b);
    let spec = a.spec.expect("spec");
    assert_eq!(spec.payload, b"world");
    assert_eq!(spec.timeout_ms, Some(30_000));
    assert_eq!(spec.route_strategy, pb::RouteStrategy::LeastActive as i32);
    assert!(matches!(
        spec.target,
        Some(pb::job_spec::Target::Executor(_))
    ));
}

#[test]
fn responses_write_camel_case_names_and_strings_for_int64() {
    let job = pb::Job {
        spec: Some(pb::JobSpec {
            id: "hello".into(),
            ..Default::default()
        }),
        version: 3,
        state: pb::JobState::Active as i32,
        next_fire_time_ms: 1_764_680_400_000,
        ..Default::default()
    };
    let v = serde_json::to_value(&job).expect("serialize");
    assert_eq!(v["state"], "JOB_STATE_ACTIVE");
    assert_eq!(v["nextFireTimeMs"], "1764680400000");
    assert_eq!(v["version"], "3");
    assert_eq!(v["spec"]["id"], "hello");
    let back: pb::Job = serde_json::from_value(v).expect("read back");
    assert_eq!(back, job);
}

#[test]
fn unknown_fields_and_bad_values_are_refused_naming_them() {
    let e = serde_json::from_str::<pb::CreateJobRequest>(r#"{"spec": {"idd": "x"}}"#)
        .expect_err("an unknown field");
    assert!(e.to_string().contains("idd"), "{e}");
    let e = serde_json::from_str::<pb::JobSpec>(r#"{"routeStrategy": "FASTEST"}"#)
        .expect_err("an unknown enum name");
    assert!(e.to_string().contains("FASTEST"), "{e}");
}
