//! The serve core driven directly, with no transport (issue 14): concurrent jobs batched give
//! each one's solo output; a session lease is released however its job ends; every refused
//! request names its rule.

mod model_support;

use std::time::{Duration, Instant};

use k3_engine::engine::{Engine, EngineOptions, GenerateRequest, RequestError, Sampling, Step};
use k3_engine::model::LoadOptions;
use k3_engine::plan::PlanInputs;
use k3_engine::serve::{
    Api, Caller, Capacity, Config, Core, Event, Field, FinishReason, Health, Invalid, JobHandle,
    Limits, Prompt, Request, ServeError, UidLimits,
};
use k3_engine::session::SessionStoreError;
use k3_engine::tokenizer::chat::{Conversation, Message, Role, Thinking, Tool, ToolChoice};
use model_support::*;

const ACTIVE: usize = 3;
/// The daemon-side max_tokens cap of these cores.
const CAP: usize = 4096;

fn core(dir: &std::path::Path, sessions: &std::path::Path, capacity: Capacity) -> Core {
    core_with(dir, sessions, capacity, |_| {})
}

/// [`core`], with `tweak` applied to its configuration last.
fn core_with(
    dir: &std::path::Path,
    sessions: &std::path::Path,
    capacity: Capacity,
    tweak: impl FnOnce(&mut Config),
) -> Core {
    let mut config = Config::new(dir.to_path_buf(), sessions.to_path_buf());
    config.engine = EngineOptions {
        threads: 1,
        model: LoadOptions {
            plan: PlanInputs {
                max_tokens_per_call: (k3_engine::engine::PREFILL_CHUNK * capacity.max_batch) as u64,
                sequences: capacity.max_active as u64,
                ..PlanInputs::default()
            },
            ..LoadOptions::default()
        },
        ..EngineOptions::default()
    };
    config.capacity = capacity;
    config.limits = Limits {
        max_tokens_cap: CAP,
        speculate: 0,
        max_prompt_tokens: k3_engine::serve::limits::MAX_PROMPT_TOKENS,
        ..Limits::default()
    };
    tweak(&mut config);
    let core = Core::new(config).expect("core");
    core.start().expect("start");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(core.health(), Health::Ready) {
        assert!(
            !matches!(core.health(), Health::Failed(_)),
            "{:?}",
            core.health()
        );
        assert!(Instant::now() < deadline, "not ready in 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    core
}

fn ids(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        max_tokens: Some(max_tokens),
        ..Request::new(Prompt::Ids(prompt))
    }
}

/// Every event of a job to its end: the generated ids, and Done or the error.
fn drain(job: &JobHandle) -> (Vec<u32>, Result<FinishReason, ServeError>) {
    let mut out = Vec::new();
    while let Some(e) = job.events.recv() {
        match e {
            Event::Token { id, .. } => out.push(id),
            Event::Done(d) => return (out, Ok(d.finish)),
            Event::Failed(e) => return (out, Err(e)),
            _ => {}
        }
    }
    panic!("the stream ended without Done or Failed");
}

fn solo(dir: &std::path::Path, request: GenerateRequest) -> Vec<u32> {
    let engine = Engine::open(
        dir,
        EngineOptions {
            threads: 1,
            ..EngineOptions::default()
        },
        &mut |_| {},
    )
    .expect("engine");
    let mut g = engine.start(request).expect("start");
    loop {
        if let Step::Finished(s) = engine.step(&mut g, &|| false).expect("step") {
            return s.generated;
        }
    }
}

#[test]
fn concurrent_jobs_batched_equal_their_solo_outputs() {
    let ck = synth("tiny", 5);
    let sessions = ck.dir.join("sessions");
    let prompts: Vec<Vec<u32>> = vec![vec![11, 12, 13], vec![40, 3, 7, 9, 100], vec![5]];
    let sampled = Sampling {
        temperature: 0.8,
        top_p: 0.9,
        seed: 7,
        ..Sampling::default()
    };
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            solo(
                &ck.dir,
                GenerateRequest {
                    prompt: p.clone(),
                    max_tokens: 6,
                    sampling: if i == 1 {
                        sampled.clone()
                    } else {
                        Sampling::default()
                    },
                    ..GenerateRequest::default()
                },
            )
        })
        .collect();
    let core = core(
        &ck.dir,
        &sessions,
        Capacity {
            max_active: ACTIVE,
            max_batch: ACTIVE,
            max_queue: 4,
            per_uid: UidLimits::default(),
        },
    );
    let jobs: Vec<JobHandle> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = ids(p.clone(), 6);
            if i == 1 {
                r.sampling = sampled.clone();
            }
            core.submit(Caller::Uid(1000 + i as u32), r)
                .expect("submit")
        })
        .collect();
    let got: Vec<Vec<u32>> = jobs
        .iter()
        .map(|j| {
            let (ids, end) = drain(j);
            assert!(end.is_ok(), "{end:?}");
            ids
        })
        .collect();
    assert_eq!(got, alone, "batched jobs equal their solo runs");
    let stats = core.status().admission.stats;
    assert!(stats.widest_batch >= 2, "the jobs shared passes: {stats:?}");
    let m = core.metrics();
    assert_eq!(m.counters.completed, 3);
    assert_eq!(m.timings.generated_tokens, 18);
    assert_eq!(m.timings.first_tokens, 3);
}

/// A core over a fresh tiny model (seed `seed`) computing one job at a time, `max_queue`
/// waiting; the checkpoint is removed when the first value is dropped.
fn one_slot(seed: u64, max_queue: usize) -> (TempCheckpoint, Core) {
    one_slot_with(seed, max_queue, |_| {})
}

/// [`one_slot`], with `tweak` applied to its configuration last.
fn one_slot_with(
    seed: u64,
    max_queue: usize,
    tweak: impl FnOnce(&mut Config),
) -> (TempCheckpoint, Core) {
    let ck = synth("tiny", seed);
    let one = Capacity {
        max_active: 1,
        max_batch: 1,
        max_queue,
        per_uid: UidLimits::default(),
    };
    let core = core_with(&ck.dir, &ck.dir.join("sessions"), one, tweak);
    (ck, core)
}

/// Waits until `job` computes (its first step's event).
fn computing(job: &JobHandle) {
    while let Some(e) = job.events.recv() {
        if matches!(e, Event::Prefill { .. } | Event::Token { .. }) {
            return;
        }
    }
    panic!("job {} ended before it computed", job.id);
}

/// The session's next job is leased (not refused as in use).
fn usable(core: &Core, name: &str, what: &str) {
    let mut r = ids(vec![1, 2, 3], 2);
    r.session = Some(name.into());
    match core.submit(Caller::Uid(7), r) {
        Ok(job) => {
            let (_, end) = drain(&job);
            assert!(end.is_ok(), "{what}: {end:?}");
        }
        Err(e) => panic!("{what}: session {name:?} still held: {e}"),
    }
}

fn on_session(name: &str, max_tokens: usize) -> Request {
    let mut r = ids(vec![9, 8, 7, 6], max_tokens);
    r.session = Some(name.into());
    r
}

#[test]
fn a_session_lease_is_released_however_the_job_ends() {
    let (_ck, core) = one_slot(6, 4);
    // Done.
    let job = core
        .submit(Caller::Uid(7), on_session("s", 3))
        .expect("submit");
    assert!(drain(&job).1.is_ok());
    usable(&core, "s", "done");

    // While one job holds the only compute slot, others queue.
    let blocker = core
        .submit(Caller::Uid(7), ids(vec![4, 4, 4], 4000))
        .expect("blocker");
    computing(&blocker);
    // Cancelled while queued.
    let queued = core
        .submit(Caller::Uid(7), on_session("s", 3))
        .expect("queued");
    let r = on_session("s", 3);
    assert!(
        matches!(core.submit(Caller::Uid(7), r), Err(ServeError::Session(e)) if matches!(*e, SessionStoreError::Busy { .. })),
        "one job at a time per session"
    );
    queued.cancel();
    assert!(matches!(
        drain(&queued).1,
        Err(ServeError::CancelledQueued(_))
    ));
    usable_later(&core, "s", &blocker);
}

/// `usable` once the blocker is out of the way; the abandoned, running-cancel, shutdown cases.
fn usable_later(core: &Core, name: &str, blocker: &JobHandle) {
    // Abandoned while queued: dropping the receiver releases the lease at once.
    let queued = core
        .submit(Caller::Uid(7), on_session(name, 3))
        .expect("queued");
    drop(queued);
    let again = core
        .submit(Caller::Uid(7), on_session(name, 3))
        .expect("the abandoned job's lease was released");
    // Cancelled while running.
    blocker.cancel();
    let end = drain(blocker).1;
    assert!(matches!(end, Err(ServeError::Cancelled(_))), "{end:?}");
    again.cancel();
    let _ = drain(&again);
    usable(core, name, "cancelled while running");
    // Shutdown: queued and running jobs are cancelled and their leases released.
    let running = core
        .submit(Caller::Uid(7), on_session(name, 4000))
        .expect("running");
    computing(&running);
    let other = core
        .submit(Caller::Uid(7), on_session("t", 3))
        .expect("queued");
    core.close();
    core.stop_all();
    assert!(matches!(drain(&running).1, Err(ServeError::Shutdown)));
    assert!(matches!(drain(&other).1, Err(ServeError::Shutdown)));
    assert!(core.join(Duration::from_secs(30)), "the scheduler ended");
    let listed = core.sessions().list(Some(7)).expect("list");
    assert!(
        listed.iter().all(|s| s.in_use.is_none()),
        "no session is left in use: {listed:?}"
    );
}

#[test]
fn every_refusal_names_its_rule() {
    let (_ck, core) = one_slot(7, 0);
    let vocab = core.tokenizer().vocab_size() as u32;
    let refused = |r: Request| match core.submit(Caller::Unknown, r) {
        Err(ServeError::Invalid(i)) => i,
        Err(e) => panic!("not an invalid request: {e}"),
        Ok(_) => panic!("accepted"),
    };
    assert_eq!(
        refused(ids(vec![], 4)),
        Invalid::Request(RequestError::EmptyPrompt)
    );
    assert!(matches!(
        refused(ids(vec![1, vocab + 5], 4)),
        Invalid::Request(RequestError::IdOutsideVocabulary { position: 1, .. })
    ));
    let mut r = ids(vec![1], 4);
    r.sampling.temperature = f32::NAN;
    assert!(matches!(
        refused(r),
        Invalid::Request(RequestError::Temperature(_))
    ));
    let mut r = ids(vec![1], 4);
    r.sampling.top_p = 1.5;
    assert!(matches!(
        refused(r),
        Invalid::Request(RequestError::TopP(_))
    ));
    let mut r = ids(vec![1], 4);
    r.speculate = Some(17);
    assert!(matches!(
        refused(r),
        Invalid::Request(RequestError::Speculate { asked: 17 })
    ));
    let mut r = ids(vec![1], 4);
    r.stop_ids = vec![1; 257];
    assert_eq!(refused(r), Invalid::TooManyStopIds { given: 257 });
    let mut r = ids(vec![1], 4);
    r.stop_strings = vec!["x".into(); 17];
    assert_eq!(refused(r), Invalid::TooManyStopStrings { given: 17 });
    let mut r = ids(vec![1], 4);
    r.stop_strings = vec!["x".repeat(300)];
    assert_eq!(refused(r), Invalid::StopStringTooLong { bytes: 300 });
    let mut r = ids(vec![1], 4);
    r.stop_strings = vec![String::new()];
    assert_eq!(refused(r), Invalid::Request(RequestError::EmptyStopString));
    assert_eq!(
        refused(ids(vec![1; (1 << 20) + 1], 4)),
        Invalid::PromptTooLong {
            tokens: (1 << 20) + 1,
            limit: 1 << 20
        }
    );
    // The synthetic model advertises 1,048,576 positions: a prompt that fills them leaves no
    // room for new tokens.
    assert_eq!(
        refused(ids(vec![1; 1 << 20], 4)),
        Invalid::ContextFull {
            prompt: 1 << 20,
            context: 1 << 20
        }
    );
    let chat = |messages: Vec<Message>| {
        Request::new(Prompt::Chat(Conversation {
            messages,
            ..Conversation::default()
        }))
    };
    assert_eq!(refused(chat(vec![])), Invalid::NoMessages);
    // Issue 44: the rules transports used to apply themselves, now the core's, each naming the
    // request field a transport turns into its parameter.
    let mut r = ids(vec![1], 4);
    r.max_tokens = Some(0);
    assert_eq!(refused(r), Invalid::NoTokens);
    assert_eq!(Invalid::NoTokens.field(), Field::MaxTokens);
    let mut r = ids(vec![1], 4);
    r.transform.presence_penalty = -3.0;
    assert_eq!(refused(r).field(), Field::PresencePenalty);
    let mut r = ids(vec![1], 4);
    r.transform.bias = vec![(1, 100.5)];
    assert_eq!(refused(r).field(), Field::LogitBias);
    // Each API's documented temperature range: 1.5 is OpenAI's to give, not Anthropic's.
    let warm = |api| {
        let mut r = ids(vec![1], 1);
        r.api = api;
        r.sampling.temperature = 1.5;
        r
    };
    assert_eq!(
        refused(warm(Api::Anthropic)),
        Invalid::Temperature {
            value: 1.5,
            max: 1.0
        }
    );
    let (_, end) = drain(
        &core
            .submit(Caller::Unknown, warm(Api::OpenAi))
            .expect("OpenAI's range"),
    );
    assert!(end.is_ok(), "{end:?}");
    // A forced call: without tools, of an unknown tool, and with thinking on Anthropic's API.
    let forced = |api, tools: Vec<&str>, choice| Request {
        api,
        ..Request::new(Prompt::Chat(Conversation {
            messages: vec![Message::new(Role::User, "hi")],
            tools: tools
                .into_iter()
                .map(|name| Tool {
                    name: name.into(),
                    description: None,
                    parameters: None,
                })
                .collect(),
            tool_choice: choice,
            ..Conversation::default()
        }))
    };
    let named = |name: &str| ToolChoice::Function(name.into());
    // The template's own rules, each naming the tool choice.
    let rendered = |r| match refused(r) {
        Invalid::Render { field, reason } => (field, reason),
        other => panic!("not the template's refusal: {other:?}"),
    };
    let (field, reason) = rendered(forced(Api::OpenAi, vec![], ToolChoice::Required));
    assert_eq!(field, Field::ToolChoice);
    assert!(reason.contains("needs at least one tool"), "{reason}");
    let (field, reason) = rendered(forced(Api::OpenAi, vec!["weather"], named("nope")));
    assert_eq!(field, Field::ToolChoice);
    assert!(
        reason.contains("\"nope\", which is not in `tools`"),
        "{reason}"
    );
    assert!(
        Conversation::default().thinking.is_on(),
        "thinking on by default"
    );
    assert_eq!(
        refused(forced(Api::Anthropic, vec!["weather"], named("weather"))),
        Invalid::ThinkingWithForcedCall
    );
    // Busy: one running, no queue; the refusal carries the queue's state.
    let running = core
        .submit(Caller::Unknown, ids(vec![1, 2], 4000))
        .expect("running");
    match core.submit(Caller::Unknown, ids(vec![1, 2], 4)) {
        Err(ServeError::Busy(q)) => {
            // The first is running or about to be taken from the queue.
            assert_eq!((q.running + q.queued, q.max_queue), (1, 0), "{q:?}")
        }
        other => panic!("expected Busy, got {:?}", other.err()),
    }
    drop(running);
    core.close();
    assert!(matches!(
        core.submit(Caller::Unknown, ids(vec![1], 4)),
        Err(ServeError::ShuttingDown)
    ));
}

/// [`one_slot`] with room for kept states (they live in the session allowance), for the
/// automatic prefix reuse tests.
fn reusing_slot(seed: u64) -> (TempCheckpoint, Core) {
    one_slot_with(seed, 4, |c| c.session_bytes = Some(64 << 20))
}

/// Automatic prefix reuse warms a chat's next turn once its reply is out (`serve::prefix`):
/// the caller's next request — sent at once, as an agent's is — prefills only what the user
/// added, although the re-rendered reply need not be the generated ids, and its output is
/// the fresh computation's.
#[test]
fn a_chats_next_turn_prefills_only_what_the_user_added() {
    let (ck, core) = reusing_slot(11);
    let tokenizer = k3_engine::tokenizer::Tokenizer::load(&ck.dir).expect("tokenizer");
    let conversation = |messages: Vec<Message>| Conversation {
        messages,
        thinking: k3_engine::tokenizer::chat::Thinking::Off,
        ..Conversation::default()
    };
    let chat = |messages: Vec<Message>, reuse: bool| Request {
        max_tokens: Some(6),
        reuse: Some(reuse),
        ..Request::new(Prompt::Chat(conversation(messages)))
    };
    // The reply as an OpenAI client keeps it: its response-channel text.
    let reply = |job: &JobHandle| {
        let mut content = String::new();
        while let Some(e) = job.events.recv() {
            match e {
                Event::Token { piece, .. }
                    if piece.channel == k3_engine::serve::Channel::Response =>
                {
                    content.push_str(&piece.text)
                }
                Event::Done(d) => {
                    assert!(d.malformed.is_none(), "{:?}", d.malformed);
                    content.push_str(&d.trailing_text);
                    return (content, d.summary);
                }
                Event::Failed(e) => panic!("{e}"),
                _ => {}
            }
        }
        panic!("no Done");
    };
    let mut messages = vec![Message::new(Role::User, "Name a river.")];
    let first = core
        .submit(Caller::Uid(7), chat(messages.clone(), true))
        .expect("turn 1");
    let (content, _) = reply(&first);
    let follow_up = Message::new(Role::User, "And another?");
    messages.extend([Message::new(Role::Assistant, content), follow_up.clone()]);
    // Submitted while the first turn's history is being warmed: it waits for it.
    let second = core
        .submit(Caller::Uid(7), chat(messages.clone(), true))
        .expect("turn 2");
    let (reused_text, reused) = reply(&second);
    // What only this turn adds: the user's message and the generation prompt, which render
    // on their own exactly as they do after the history (segments are encoded one by one).
    let mut added = conversation(vec![follow_up]);
    added.generation_prompt = true;
    let added = k3_engine::tokenizer::chat::render(&tokenizer, &added).expect("render");
    assert_eq!(
        reused.prompt_tokens - reused.reused_tokens,
        added.len(),
        "the next turn prefilled more than the user's message: {reused:?}"
    );
    let fresh = core
        .submit(Caller::Uid(7), chat(messages, false))
        .expect("fresh");
    let (fresh_text, fresh) = reply(&fresh);
    assert_eq!(fresh.reused_tokens, 0);
    assert_eq!(
        (reused_text, reused.generated),
        (fresh_text, fresh.generated)
    );
    assert!(core.metrics().timings.warmed_tokens > 0);
}

/// Warming a chat's next turn never delays another caller: a request that waits for the slot
/// when the reply ends takes it, and the warming is dropped before it fed anything.
#[test]
fn warming_yields_its_slot_to_another_callers_waiting_request() {
    let (_ck, core) = reusing_slot(12);
    let chat = Request {
        max_tokens: Some(24),
        reuse: Some(true),
        ..Request::new(Prompt::Chat(Conversation {
            messages: vec![Message::new(Role::User, "Name a river.")],
            thinking: k3_engine::tokenizer::chat::Thinking::Off,
            ..Conversation::default()
        }))
    };
    let first = core.submit(Caller::Uid(7), chat).expect("chat");
    computing(&first);
    // Queued behind the chat before its reply ends: another caller (no reuse) waits.
    let other = core
        .submit(Caller::Uid(8), ids(vec![5, 6, 7], 3))
        .expect("other");
    let (_, end) = drain(&first);
    assert!(end.is_ok(), "{end:?}");
    let (out, end) = drain(&other);
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(out.len(), 3);
    assert_eq!(
        core.metrics().timings.warmed_tokens,
        0,
        "the warming ran while another request waited"
    );
}

/// Issue 35 point 3: `max_prompt_tokens` is counted after rendering (a chat's tools weigh as
/// much as its messages), names the limit, and `count_tokens` answers within the same limit.
#[test]
fn a_prompt_over_max_prompt_tokens_is_refused_after_rendering_naming_the_limit() {
    // The tiny model's vocabulary spells most text byte by byte: one short message renders
    // to a few hundred ids.
    let limit = 400;
    let (_ck, core) = one_slot_with(13, 4, |c| c.limits.max_prompt_tokens = limit);
    let refused = |r: Request| match core.submit(Caller::Uid(7), r) {
        Err(ServeError::Invalid(i)) => i,
        Err(e) => panic!("not an invalid request: {e}"),
        Ok(_) => panic!("accepted"),
    };
    let job = core
        .submit(Caller::Uid(7), ids(vec![3; limit], 2))
        .expect("at the limit");
    assert!(drain(&job).1.is_ok());
    let over = refused(ids(vec![3; limit + 1], 2));
    assert_eq!(
        over,
        Invalid::PromptTooLong {
            tokens: limit + 1,
            limit
        }
    );
    assert!(
        over.to_string().contains("--max-prompt-tokens") && over.to_string().contains("400"),
        "{over}"
    );

    // One short message: within the limit, and count_tokens says exactly how long it is.
    let short = Conversation {
        messages: vec![Message::new(Role::User, "Hi.")],
        ..Conversation::default()
    };
    let counted = core
        .count_tokens(
            core.turn(core.reserve(&Caller::Uid(7)).expect("place")),
            short.clone(),
        )
        .expect("counted");
    let job = core
        .submit(Caller::Uid(7), ids_chat(short.clone()))
        .expect("a short chat");
    assert_eq!(job.prompt_tokens, counted);
    assert!(drain(&job).1.is_ok());

    // The same message with a tool declared: the tool's rendering makes it too long.
    let tool = k3_engine::tokenizer::chat::Tool {
        name: "look_up".into(),
        description: Some(
            "Looks a word up in the dictionary and returns every sense it has.".into(),
        ),
        parameters: Some(serde_json::json!(
            {"type": "object", "properties": {"word": {"type": "string"}}}
        )),
    };
    let with_tool = Conversation {
        tools: vec![tool],
        ..short
    };
    let Invalid::PromptTooLong { tokens, limit: l } = refused(ids_chat(with_tool.clone())) else {
        panic!("not refused for its length");
    };
    assert!(tokens > limit && l == limit, "{tokens} of {l}");
    let count = core.count_tokens(
        core.turn(core.reserve(&Caller::Uid(7)).expect("place")),
        with_tool,
    );
    assert!(
        matches!(count, Err(ServeError::Invalid(Invalid::PromptTooLong { tokens: t, .. })) if t == tokens),
        "{count:?}"
    );
    assert_eq!(
        core.status().admission.queued,
        0,
        "count_tokens gave its place back"
    );

    // More tools than the limit holds at their fewest ids each: refused by their count before
    // anything is rendered, on every transport (the HTTP readers refuse while reading them).
    let most = k3_engine::tokenizer::chat::most_tools(limit);
    let many = Conversation {
        messages: vec![Message::new(Role::User, "Hi.")],
        tools: (0..=most)
            .map(|i| k3_engine::tokenizer::chat::Tool {
                name: format!("t{i}"),
                description: None,
                parameters: None,
            })
            .collect(),
        ..Conversation::default()
    };
    assert_eq!(
        refused(ids_chat(many)),
        Invalid::TooManyTools {
            tools: most + 1,
            limit
        }
    );
}

fn ids_chat(conversation: Conversation) -> Request {
    Request {
        max_tokens: Some(2),
        ..Request::new(Prompt::Chat(conversation))
    }
}

/// A core computing one job at a time whose readers stall after `stall`, with `session_bytes`
/// of session allowance to park stalled jobs in.
fn stalling_slot(seed: u64, session_bytes: u64) -> (TempCheckpoint, Core) {
    one_slot_with(seed, 4, |c| {
        c.session_bytes = Some(session_bytes);
        c.stall_timeout = Duration::from_millis(200);
    })
}

/// Issue 35 point 4: a job whose reader takes nothing gives its compute slot to the one
/// waiting, keeping its state; when its reader reads again it resumes exactly where it
/// stopped and its whole output is the solo run's.
#[test]
fn a_stalled_reader_gives_its_slot_back_and_later_gets_its_whole_reply() {
    let (ck, core) = stalling_slot(14, 64 << 20);
    let request = ids(vec![21, 22, 23], 64);
    let unread = core
        .submit(Caller::Uid(7), request.clone())
        .expect("unread");
    computing(&unread);
    let other = core
        .submit(Caller::Uid(8), ids(vec![5, 6, 7], 8))
        .expect("other");
    let started = Instant::now();
    let (out, end) = drain(&other);
    assert!(end.is_ok(), "{end:?}");
    assert_eq!(out.len(), 8);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the other request waited {:?}",
        started.elapsed()
    );
    let status = core.status();
    assert_eq!(
        status.admission.counters.stalled, 1,
        "{:?}",
        status.admission.counters
    );
    let (got, end) = drain(&unread);
    assert!(end.is_ok(), "{end:?}");
    let alone = solo(
        &ck.dir,
        GenerateRequest {
            prompt: vec![21, 22, 23],
            max_tokens: 64,
            ..GenerateRequest::default()
        },
    );
    assert_eq!(got, alone, "the parked job's output");
    assert!(core.drained());
}

/// With no room in the session allowance to keep its state, a stalled job is cancelled, and
/// its reader, coming back, finds what it left unread and then why it ended.
#[test]
fn a_stalled_reader_without_room_to_park_is_cancelled_with_a_clear_error() {
    let (_ck, core) = stalling_slot(15, 0);
    let unread = core
        .submit(Caller::Uid(7), ids(vec![21, 22, 23], 64))
        .expect("unread");
    computing(&unread);
    let other = core
        .submit(Caller::Uid(8), ids(vec![5, 6, 7], 8))
        .expect("other");
    assert!(drain(&other).1.is_ok());
    let (got, end) = drain(&unread);
    assert!(!got.is_empty() && got.len() < 64, "{} tokens", got.len());
    match end {
        Err(e @ ServeError::Stalled { .. }) => {
            assert!(e.to_string().contains("--stall-timeout"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let counters = core.status().admission.counters;
    assert_eq!(
        (counters.stalled, counters.cancelled),
        (1, 1),
        "{counters:?}"
    );
}

/// Issue 34.4: `max_tokens` is a ceiling. Any value is clamped to the daemon's cap (an agent's
/// 32,000 is never a 400); unset, a chat runs up to the cap and a plain continuation gets 256
/// (here: the cap, lower); the finish says `Length` when the limit ended the reply.
#[test]
fn max_tokens_is_clamped_to_the_cap_never_refused() {
    let (_ck, core) = one_slot_with(21, 4, |c| c.limits.max_tokens_cap = 5);
    for asked in [Some(1_000_000), Some(6), None] {
        let job = core
            .submit(
                Caller::Unknown,
                Request {
                    max_tokens: asked,
                    ..Request::new(Prompt::Ids(vec![1, 2, 3]))
                },
            )
            .expect("accepted");
        let (out, finish) = drain(&job);
        assert_eq!(
            (out.len(), finish.ok()),
            (5, Some(FinishReason::Length)),
            "{asked:?}"
        );
    }
    let chat = core
        .submit(
            Caller::Unknown,
            Request::new(Prompt::Chat(Conversation {
                messages: vec![Message::new(Role::User, "hi")],
                thinking: Thinking::Off,
                ..Conversation::default()
            })),
        )
        .expect("accepted");
    let (out, finish) = drain(&chat);
    assert!(out.len() <= 5, "{} tokens", out.len());
    assert!(finish.is_ok(), "{finish:?}");
}

/// The first generated id with a text channel (the random model may break the grammar at once,
/// after which every id is `Control`).
fn first_channel(job: &JobHandle) -> Option<k3_engine::serve::Channel> {
    let mut first = None;
    while let Some(e) = job.events.recv() {
        match e {
            Event::Token { piece, .. } if first.is_none() => first = Some(piece.channel),
            Event::Done(_) => return first,
            Event::Failed(e) => panic!("{e}"),
            _ => {}
        }
    }
    panic!("no Done");
}

/// Issue 34.3: a conversation that ends with an assistant message is answered with a new turn
/// (OpenAI's and vLLM's reading), opening in the think channel when thinking is on; a final
/// message marked `partial` is continued instead, its reply read from the response channel.
#[test]
fn a_final_assistant_message_is_answered_or_continued() {
    use k3_engine::serve::Channel;
    let (_ck, core) = one_slot(23, 4);
    let ask = |partial: bool| {
        let mut last = Message::new(Role::Assistant, "The answer is");
        last.partial = partial;
        Request {
            max_tokens: Some(3),
            ..Request::new(Prompt::Chat(Conversation {
                messages: vec![Message::new(Role::User, "hi"), last],
                thinking: Thinking::On(None),
                ..Conversation::default()
            }))
        }
    };
    let answered = core
        .submit(Caller::Unknown, ask(false))
        .expect("a new turn");
    assert!(
        matches!(
            first_channel(&answered),
            Some(Channel::Reasoning | Channel::Control)
        ),
        "a new turn opens in the think channel"
    );
    let continued = core.submit(Caller::Unknown, ask(true)).expect("continued");
    assert!(
        matches!(
            first_channel(&continued),
            Some(Channel::Response | Channel::Control)
        ),
        "a continued answer carries on in the response channel"
    );
}

/// Runs `job` to its end: the generated ids and the engine's summary.
fn completed(job: &JobHandle) -> (Vec<u32>, k3_engine::engine::Summary) {
    let mut out = Vec::new();
    while let Some(e) = job.events.recv() {
        match e {
            Event::Token { id, .. } => out.push(id),
            Event::Done(d) => return (out, d.summary),
            Event::Failed(e) => panic!("{e}"),
            _ => {}
        }
    }
    panic!("the stream ended without Done or Failed");
}

fn chat_of(messages: &[(Role, &str)], reuse: bool) -> Request {
    Request {
        max_tokens: Some(5),
        reuse: Some(reuse),
        ..Request::new(Prompt::Chat(Conversation {
            messages: messages
                .iter()
                .map(|(role, text)| Message::new(*role, *text))
                .collect(),
            thinking: k3_engine::tokenizer::chat::Thinking::Off,
            ..Conversation::default()
        }))
    }
}

/// Issue 34 point 5: an identical retry reuses all but the prompt's last id, a retry whose last
/// message changed reuses everything before that message, and both answer exactly as a fresh
/// computation does.
#[test]
fn a_retry_reuses_all_but_what_changed_and_answers_as_computed_afresh() {
    let (ck, core) = reusing_slot(13);
    let tokenizer = k3_engine::tokenizer::Tokenizer::load(&ck.dir).expect("tokenizer");
    let history = [
        (Role::System, "You answer briefly."),
        (Role::User, "Name a river."),
        (Role::Assistant, "The Rhine."),
    ];
    let asked = |last: &'static str| {
        let mut m = history.to_vec();
        m.push((Role::User, last));
        m
    };
    let me = Caller::Uid(7);
    let (first_out, first) = completed(
        &core
            .submit(me.clone(), chat_of(&asked("And a sea?"), true))
            .expect("1"),
    );
    assert_eq!(first.reused_tokens, 0);
    let (retry_out, retry) = completed(
        &core
            .submit(me.clone(), chat_of(&asked("And a sea?"), true))
            .expect("2"),
    );
    assert_eq!(
        retry.reused_tokens,
        retry.prompt_tokens - 1,
        "identical retry: {retry:?}"
    );
    assert_eq!(retry_out, first_out);
    // The last message edited: everything before it is reused.
    let mut before = Conversation {
        messages: history.iter().map(|(r, t)| Message::new(*r, *t)).collect(),
        thinking: k3_engine::tokenizer::chat::Thinking::Off,
        ..Conversation::default()
    };
    before.generation_prompt = false;
    let kept = k3_engine::tokenizer::chat::render(&tokenizer, &before).expect("render");
    let (edited_out, edited) = completed(
        &core
            .submit(me.clone(), chat_of(&asked("And a lake?"), true))
            .expect("3"),
    );
    assert_eq!(edited.reused_tokens, kept.len(), "edited retry: {edited:?}");
    let (fresh_out, fresh) = completed(
        &core
            .submit(me, chat_of(&asked("And a lake?"), false))
            .expect("4"),
    );
    assert_eq!(fresh.reused_tokens, 0);
    assert_eq!(edited_out, fresh_out);
}

/// Issue 35 point 7: a state is continued only by the caller it was kept for; a caller nobody
/// vouches for reuses nothing, not even its own identical request.
#[test]
fn kept_states_are_never_shared_between_callers() {
    let (_ck, core) = reusing_slot(14);
    let secret = [(Role::User, "My password is hunter2. Remember it.")];
    let reused = |caller: Caller| {
        let (_, s) = completed(&core.submit(caller, chat_of(&secret, true)).expect("submit"));
        s.reused_tokens
    };
    let scoped = |scope: &str| Caller::Key {
        key: 0,
        scope: Some(scope.into()),
    };
    assert_eq!(reused(Caller::Uid(7)), 0);
    assert!(reused(Caller::Uid(7)) > 0, "the same uid reuses its own");
    assert_eq!(reused(Caller::Uid(8)), 0, "another uid");
    assert_eq!(reused(scoped("a")), 0);
    assert!(reused(scoped("a")) > 0, "the same key and scope");
    for other in [
        scoped("b"),
        scoped("a").account(),
        Caller::Key {
            key: 1,
            scope: Some("a".into()),
        },
    ] {
        assert_eq!(reused(other.clone()), 0, "{other}");
    }
    assert_eq!(reused(Caller::Unknown), 0);
    assert_eq!(
        reused(Caller::Unknown),
        0,
        "an unknown caller keeps nothing"
    );
}

/// Issue 42 points 1–3: a new conversation of the same caller with the same prelude — its
/// tools and opening system message, and like Claude Code's a system message after the
/// user's, so the last two message starts hold nothing a new conversation shares — prefills
/// only its conversation: in the same daemon, and after a restart from the state written to
/// the caller's namespace of the session directory (0600), loaded with the bits it was
/// kept with (the answer is the fresh computation's). Nothing is kept for another uid, nor on
/// disk for a caller nobody vouches for.
#[test]
fn a_new_conversation_with_the_same_prelude_continues_from_it_even_after_a_restart() {
    use k3_engine::tokenizer::chat::Tool;
    use std::os::unix::fs::PermissionsExt;
    let ck = synth("tiny", 15);
    let sessions = ck.dir.join("sessions");
    let one = Capacity {
        max_active: 1,
        max_batch: 1,
        max_queue: 4,
        per_uid: UidLimits::default(),
    };
    let start = || {
        core_with(&ck.dir, &sessions, one, |c| {
            c.session_bytes = Some(64 << 20)
        })
    };
    let tools = vec![Tool {
        name: "read_file".into(),
        description: Some("Reads a file of the project.".into()),
        parameters: Some(serde_json::json!({
            "type": "object",
            "properties": {"path": {"type": "string"}}
        })),
    }];
    let conversation = |question: &str| Conversation {
        messages: vec![
            Message::new(Role::System, "You are a careful coding agent."),
            Message::new(Role::User, question),
            Message::new(Role::System, "Reminder: answer briefly."),
        ],
        tools: tools.clone(),
        thinking: Thinking::Off,
        ..Conversation::default()
    };
    let chat = |question: &str, reuse: bool| Request {
        max_tokens: Some(4),
        reuse: Some(reuse),
        ..Request::new(Prompt::Chat(conversation(question)))
    };
    let tokenizer = k3_engine::tokenizer::Tokenizer::load(&ck.dir).expect("tokenizer");
    let mut prelude = conversation("");
    prelude.messages.truncate(1);
    let prelude = k3_engine::tokenizer::chat::render(&tokenizer, &prelude).expect("render");
    let ask = |core: &Core, caller: Caller, question: &str, reuse: bool| {
        completed(&core.submit(caller, chat(question, reuse)).expect("submit"))
    };

    let core = start();
    assert_eq!(
        ask(&core, Caller::Uid(7), "Name a river.", true)
            .1
            .reused_tokens,
        0
    );
    let (_, second) = ask(&core, Caller::Uid(7), "Name a sea.", true);
    assert_eq!(second.reused_tokens, prelude.len(), "{second:?}");
    assert_eq!(
        ask(&core, Caller::Uid(8), "Name a sea.", true)
            .1
            .reused_tokens,
        0
    );
    ask(&core, Caller::Unknown, "Name a bay.", true);
    core.close();
    assert!(core.join(Duration::from_secs(60)));
    let kept: Vec<(String, u32)> = std::fs::read_dir(&sessions)
        .expect("the session directory")
        .map(|e| e.expect("entry"))
        .filter(|e| e.file_name().to_string_lossy().ends_with(".k3p"))
        .map(|e| {
            let mode = e.metadata().expect("metadata").permissions().mode() & 0o777;
            (e.file_name().to_string_lossy().into_owned(), mode)
        })
        .collect();
    assert!(
        kept.iter().any(|(name, _)| name.starts_with("7@")),
        "{kept:?}"
    );
    assert!(
        kept.iter().any(|(name, _)| name.starts_with("8@")),
        "{kept:?}"
    );
    for (name, mode) in &kept {
        assert!(name.starts_with("7@") || name.starts_with("8@"), "{name}");
        assert_eq!(*mode, 0o600, "{name}");
    }

    // A restart: memory is empty, the disk is not.
    let core = start();
    let (again_out, again) = ask(&core, Caller::Uid(7), "Name a lake.", true);
    assert_eq!(again.reused_tokens, prelude.len(), "{again:?}");
    let files = core.metrics().prefix_files;
    assert!(files.hits >= 1 && files.files >= kept.len(), "{files:?}");
    let (fresh_out, fresh) = ask(&core, Caller::Uid(7), "Name a lake.", false);
    assert_eq!(fresh.reused_tokens, 0);
    assert_eq!(
        again_out, fresh_out,
        "continued from disk, it answers as computed afresh"
    );
    assert_eq!(
        ask(&core, Caller::Uid(9), "Name a lake.", true)
            .1
            .reused_tokens,
        0
    );
}
