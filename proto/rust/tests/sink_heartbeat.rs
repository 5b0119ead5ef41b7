//! The sink's heartbeats, on librdkafka's mock cluster (a Kafka protocol server inside the
//! test process): an idle producer still sends a batch without records every `heartbeat`, the
//! first as soon as it starts; batches with records reset the timer; `heartbeat` zero sends
//! none until `set_heartbeat` turns them on (the agent's way: heartbeats once it traces).
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pharos_wire::sink::{Sink, SinkConfig};
use pharos_wire::{IoBatch, IoRecord};
use prost::Message;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::{Message as _, Offset, TopicPartitionList};

const TOPIC: &str = "hb";

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Every batch on the topic, in order (one partition).
fn batches(bootstrap: &str, want: usize) -> Vec<IoBatch> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "t")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < want && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            out.push(IoBatch::decode(m.payload().unwrap()).unwrap());
        }
    }
    out
}

fn sink(bootstrap: &str, heartbeat: Duration) -> Sink {
    let mut cfg = SinkConfig::new(bootstrap, TOPIC, "h:agent:1:1", "h");
    cfg.heartbeat = heartbeat;
    cfg.batch_max_ms = 20;
    Sink::new(cfg).unwrap()
}

#[test]
fn idle_sink_sends_heartbeats() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(TOPIC, 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let t0 = now_ns();
    let s = sink(&bootstrap, Duration::from_millis(200));
    std::thread::sleep(Duration::from_millis(700));
    s.push(IoRecord { job_id: "j".into(), count: 1, ..Default::default() }).unwrap();
    s.flush(Duration::from_secs(5)).unwrap();
    let stats = s.close();
    assert!(stats.heartbeats >= 3, "{stats:?}");
    let got = batches(&bootstrap, stats.batches_sent as usize);
    assert_eq!(got.len() as u64, stats.batches_sent);
    // numbered like any batch, all from this producer and host
    for (i, b) in got.iter().enumerate() {
        assert_eq!((b.seq, b.producer_id.as_str(), b.host.as_str()), (i as u64, "h:agent:1:1", "h"));
    }
    // the first leaves at once, then one per heartbeat while idle
    assert!(got[0].records.is_empty());
    assert!(got[0].created_ns - t0 < 150_000_000, "first heartbeat {} ms late", (got[0].created_ns - t0) / 1_000_000);
    let beats: Vec<u64> = got.iter().filter(|b| b.records.is_empty()).map(|b| b.created_ns).collect();
    for w in beats.windows(2).take(3) {
        let gap_ms = (w[1] - w[0]) / 1_000_000;
        assert!((150..400).contains(&gap_ms), "heartbeats {gap_ms} ms apart");
    }
    assert_eq!(got.iter().map(|b| b.records.len()).sum::<usize>(), 1);
}

#[test]
fn zero_heartbeat_sends_none_until_turned_on() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(TOPIC, 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let s = sink(&bootstrap, Duration::ZERO);
    std::thread::sleep(Duration::from_millis(300));
    s.push(IoRecord { job_id: "j".into(), count: 1, ..Default::default() }).unwrap();
    s.flush(Duration::from_secs(5)).unwrap();
    assert_eq!((s.stats().heartbeats, s.stats().batches_sent), (0, 1));
    let on = now_ns();
    s.set_heartbeat(Duration::from_millis(200)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let stats = s.close();
    assert!((2..=4).contains(&stats.heartbeats), "{stats:?}");
    let got = batches(&bootstrap, stats.batches_sent as usize);
    assert_eq!(got[0].records.len(), 1);
    assert!(got[1].records.is_empty() && got[1].created_ns - on < 150_000_000, "no heartbeat at once");
}
