// serving-bench's native sender: the wire engine of serving_bench/load/native.py (read that module first: it owns
// the protocol, the records, the status mapping and every error text; this program only sends and stamps).
//
// Why it exists: a Python sender costs 210-300 us of CPU per request (gRPC's Cython layer, two threads handing the
// GIL back and forth); on two shared cores that caps the open-loop rate below perf_analyzer's. This one sends the
// ModelInferRequest bytes serialized up front by Python through grpc::GenericStub (no protobuf code here), async
// unary calls on one completion queue, one timing thread, one completion thread.
//
// Life: read the share from stdin (the header lines, then the binary arrays) -> attach the parent's outcome arrays
// (POSIX shared memory: sent float64[n], done float64[n], status int8[n], at offsets 0, 8m, 16m, m = max(1, n)) ->
// connect, send the warm-up requests -> "R" -> wait for "go <t0>" (t0: CLOCK_MONOTONIC seconds, Python's
// time.perf_counter) -> run the open or the closed loop -> drain -> "E <cpu_s> <len>\n<reason>" -> exit.
// Commands on stdin after "go": "stop" (stop sending; in-flight requests get grace_s, then are cancelled), "cancel"
// (stop, and cancel in-flight requests at once); end of file = the parent is gone = "cancel".
// Messages on stdout (one writer thread; the completion thread never blocks on the pipe):
//   R\n                                    ready (connected, warmed up)
//   U <code> <len>\n<details>              the server could not be reached before the run (then exit)
//   F <row> <code> <oks> <len>\n<details>  request <row> failed with gRPC status <code>; <oks>: requests answered OK
//                                          since the previous F (the parent's judge resets its unavailable streak)
//   D <row>\n                              request <row> was dropped at the open-loop cap
//   E <cpu_s> <len>\n<reason>              the end: CPU seconds of this process over the run, its own stop reason
// Times written to the arrays are seconds from t0. Requests are never sent before their time (clock_nanosleep on
// CLOCK_MONOTONIC with absolute deadlines). SIGINT and SIGTERM are ignored: the parent handles them and says "stop".

#include <absl/synchronization/mutex.h>
#include <grpc/grpc.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace grpc_core {  // gRPC core's executor (exported by libgrpc, not in its public headers; weak: may be absent)
class Executor {
 public:
  static void SetThreadingAll(bool enable) __attribute__((weak));
};
}  // namespace grpc_core

namespace {

constexpr int kProtocol = 1;  // serving_bench/load/native.py: PROTOCOL
constexpr const char* kInferMethod = "/inference.GRPCInferenceService/ModelInfer";
constexpr int64_t kStopPollNs = 20'000'000;  // the longest single sleep: how late a stop is noticed while idle
constexpr int64_t kDrainPollNs = 2'000'000;
constexpr int64_t kCancelWaitNs = 5'000'000'000;  // after cancelling, how long outcomes may take to come back
constexpr int64_t kBehindNs = 5'000'000;  // a timing thread this late gives up realtime priority until it is ahead

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void sleep_until_ns(int64_t at) {  // never returns early (absolute deadline; EINTR resumes)
  timespec ts{time_t(at / 1'000'000'000), long(at % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// SCHED_FIFO at the lowest realtime priority for the calling thread (false: not permitted here), or back to
// SCHED_OTHER. Threads it creates later (gRPC's) start as SCHED_OTHER (SCHED_RESET_ON_FORK).
bool set_realtime(bool on) {
  sched_param sp{};
  sp.sched_priority = on ? 1 : 0;
  return sched_setscheduler(0, (on ? SCHED_FIFO : SCHED_OTHER) | SCHED_RESET_ON_FORK, &sp) == 0;
}

double cpu_seconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

[[noreturn]] void die(const std::string& what) {  // a broken protocol or environment: the parent reports stderr
  std::fprintf(stderr, "serving-bench-sender: %s\n", what.c_str());
  std::fflush(stderr);
  _exit(2);
}

void read_exact(void* dst, size_t size) {
  char* p = static_cast<char*>(dst);
  while (size > 0) {
    ssize_t got = read(0, p, size);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) die("stdin closed while reading the share");
    p += got;
    size -= size_t(got);
  }
}

std::string read_line() {  // "" at end of file
  std::string line;
  char c;
  while (true) {
    ssize_t got = read(0, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0 || c == '\n') return line;
    line.push_back(c);
  }
}

template <typename T>
std::vector<T> read_array(size_t count) {
  std::vector<T> out(count);
  if (count) read_exact(out.data(), count * sizeof(T));
  return out;
}

// -- output: appended by any thread, written to stdout by one thread ----------------------------------------------
class Output {
 public:
  void start() { writer_ = std::thread([this] { loop(); }); }
  void put(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    bool was_empty = buffer_.empty();
    buffer_ += message;
    if (was_empty) cv_.notify_one();
  }
  void put_text(const std::string& head, const std::string& text) {  // "<head> <len>\n<text>"
    put(head + " " + std::to_string(text.size()) + "\n" + text);
  }
  void finish() {  // write everything put so far, then stop the writer
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      cv_.notify_one();
    }
    if (writer_.joinable()) writer_.join();
  }

 private:
  void loop() {
    std::string chunk;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !buffer_.empty() || closing_; });
        if (buffer_.empty() && closing_) return;
        chunk.swap(buffer_);
      }
      size_t off = 0;
      while (off < chunk.size()) {
        ssize_t put = write(1, chunk.data() + off, chunk.size() - off);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) break;  // the parent is gone: nothing to report to
        off += size_t(put);
      }
      chunk.clear();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buffer_;
  bool closing_ = false;
  std::thread writer_;
};

Output out;

// -- the share ------------------------------------------------------------------------------------------------------
struct Share {
  std::string url, shm, mode;
  int64_t n = 0, cap = -1;
  bool drop = false;
  double timeout_s = 30, grace_s = 5, duration_s = 0;
  int status_ok = 0, status_error = 1, status_in_flight = 100;
  std::vector<int64_t> rows;       // owned schedule rows, in arrival order
  std::vector<double> arrival_s;   // per owned row
  std::vector<int32_t> payload;    // per owned row: index into payloads
  std::vector<int32_t> model;      // per owned row
  std::vector<int32_t> concurrency;  // per model (closed loop): workers in this sender
  std::vector<int32_t> warmup;     // payload indices sent once before the run
  std::vector<grpc::ByteBuffer> payloads;
};

Share read_share() {
  Share s;
  std::string first = read_line();
  if (first != "serving-bench-share " + std::to_string(kProtocol)) die("unexpected share header: " + first);
  std::map<std::string, std::string> kv;
  for (std::string line = read_line(); !line.empty(); line = read_line()) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) die("bad share line: " + line);
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  auto get = [&](const char* key) {
    auto it = kv.find(key);
    if (it == kv.end()) die(std::string("share lacks ") + key);
    return it->second;
  };
  s.url = get("url");
  s.shm = get("shm");
  s.mode = get("mode");
  s.n = std::stoll(get("n"));
  s.cap = std::stoll(get("cap"));
  s.drop = get("on_cap") == "drop";
  s.timeout_s = std::stod(get("timeout_s"));
  s.grace_s = std::stod(get("grace_s"));
  s.duration_s = std::stod(get("duration_s"));
  s.status_ok = std::stoi(get("status_ok"));
  s.status_error = std::stoi(get("status_error"));
  s.status_in_flight = std::stoi(get("status_in_flight"));
  size_t rows = std::stoull(get("rows")), models = std::stoull(get("models")), warmup = std::stoull(get("warmup")),
         payloads = std::stoull(get("payloads"));
  s.rows = read_array<int64_t>(rows);
  s.arrival_s = read_array<double>(rows);
  s.payload = read_array<int32_t>(rows);
  s.model = read_array<int32_t>(rows);
  s.concurrency = read_array<int32_t>(models);
  s.warmup = read_array<int32_t>(warmup);
  std::vector<int64_t> sizes = read_array<int64_t>(payloads);
  s.payloads.reserve(payloads);
  for (int64_t size : sizes) {
    grpc::Slice slice(size_t(size) ? size_t(size) : 0);  // uninitialized memory of that size
    if (size) read_exact(const_cast<uint8_t*>(slice.begin()), size_t(size));
    s.payloads.emplace_back(&slice, 1);  // the buffer refs the slice: every send shares these bytes
  }
  return s;
}

// -- the per-request outcome arrays (the parent's shared memory) ----------------------------------------------------
struct Arrays {
  double* sent = nullptr;
  double* done = nullptr;
  int8_t* status = nullptr;

  void attach(const std::string& name, int64_t n) {
    int64_t m = n > 0 ? n : 1;
    int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
    if (fd < 0) die("cannot open shared memory " + name + ": " + std::strerror(errno));
    void* base = mmap(nullptr, size_t(m) * 17, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) die("cannot map shared memory " + name + ": " + std::strerror(errno));
    char* p = static_cast<char*>(base);
    sent = reinterpret_cast<double*>(p);
    done = reinterpret_cast<double*>(p + 8 * m);
    status = reinterpret_cast<int8_t*>(p + 16 * m);
  }
};

// -- calls in flight --------------------------------------------------------------------------------------------------
struct Call {
  int64_t row = -1;
  int32_t model = 0;
  bool live = false;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
  grpc::ByteBuffer response;
  grpc::Status status;
};

// A pool of Call objects (a ClientContext cannot be reused, the rest can); the live ones can be cancelled from
// another thread, so taking, giving back and cancelling hold one lock.
class Calls {
 public:
  Call* take(int64_t row, int32_t model) {
    std::lock_guard<std::mutex> lock(mu_);
    Call* c;
    if (free_.empty()) {
      all_.push_back(std::make_unique<Call>());
      c = all_.back().get();
    } else {
      c = free_.back();
      free_.pop_back();
    }
    c->row = row;
    c->model = model;
    c->live = true;
    c->context = std::make_unique<grpc::ClientContext>();
    return c;
  }
  void give_back(Call* c) {
    std::lock_guard<std::mutex> lock(mu_);
    c->live = false;
    c->reader.reset();
    c->context.reset();
    c->response.Clear();
    free_.push_back(c);
  }
  void cancel_live() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : all_)
      if (c->live) c->context->TryCancel();
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<Call>> all_;
  std::vector<Call*> free_;
};

// -- the sender -------------------------------------------------------------------------------------------------------
class Sender {
 public:
  Sender(Share& share, bool realtime) : s_(share), realtime_(realtime) {
    arrays_.attach(s_.shm, s_.n);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // Per-call work a load generator does not need: transparent retries (each call buffers its message for a retry
    // that would change the schedule), BDP probing pings, channelz's per-call counters.
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
    channel_ = grpc::CreateCustomChannel(s_.url, grpc::InsecureChannelCredentials(), args);
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
    timeout_ = std::chrono::microseconds(int64_t(s_.timeout_s * 1e6));
  }

  // Connect and send the warm-up requests (blocking, before the completion thread exists). False: "U" was sent.
  bool connect() {
    auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(10);
    if (!channel_->WaitForConnected(deadline)) {
      out.put_text("U " + std::to_string(int(grpc::StatusCode::DEADLINE_EXCEEDED)),
                   "the channel did not connect within 10 s");
      return false;
    }
    for (int32_t k : s_.warmup) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::microseconds(int64_t(std::max(s_.timeout_s, 30.0) * 1e6)));
      grpc::ByteBuffer response;
      grpc::Status status;
      auto reader = stub_->PrepareUnaryCall(&context, kInferMethod, s_.payloads[size_t(k)], &cq_);
      reader->StartCall();
      reader->Finish(&response, &status, &context);
      void* tag;
      bool ok;
      if (!cq_.Next(&tag, &ok)) die("the completion queue shut down during the warm-up");
      if (!status.ok()) {
        out.put_text("U " + std::to_string(int(status.error_code())), status.error_message());
        return false;
      }
    }
    return true;
  }

  void stop(bool at_once, const char* reason) {
    {
      std::lock_guard<std::mutex> lock(reason_mu_);
      if (!stopping_.load() && reason_.empty()) reason_ = reason;
    }
    if (at_once) cancel_at_once_.store(true);
    stopping_.store(true);
    std::lock_guard<std::mutex> lock(slot_mu_);
    slot_cv_.notify_all();
  }

  // Run from t0 (CLOCK_MONOTONIC ns) to the end of the drain; returns this process's CPU seconds over the run.
  double run(int64_t t0_ns) {
    t0_ns_ = t0_ns;
    double cpu = cpu_seconds();
    std::thread completions([this] {
      set_realtime(realtime_);
      complete();
    });
    completions.detach();  // it may be blocked on a stuck call at exit: the process ends it
    if (s_.mode == "closed")
      closed_loop();
    else
      open_loop();
    drain();
    return cpu_seconds() - cpu;
  }

  std::string reason() {
    std::lock_guard<std::mutex> lock(reason_mu_);
    return reason_;
  }

 private:
  double since_t0(int64_t ns) const { return double(ns - t0_ns_) * 1e-9; }

  void send(int64_t row, int32_t model, int32_t payload) {
    Call* c = calls_.take(row, model);
    c->context->set_deadline(std::chrono::system_clock::now() + timeout_);
    arrays_.status[row] = int8_t(s_.status_in_flight);
    arrays_.sent[row] = since_t0(now_ns());
    sent_.fetch_add(1);
    c->reader = stub_->PrepareUnaryCall(c->context.get(), kInferMethod, s_.payloads[size_t(payload)], &cq_);
    c->reader->StartCall();
    c->reader->Finish(&c->response, &c->status, c);
  }

  // Realtime priority while on time: a thread that wakes at the intended time is not kept waiting for a core by
  // the server or anything else on a busy machine; one that fell kBehindNs behind (overload: the sends themselves
  // take the time) competes like any other thread until it is ahead again, so it never holds a core for long.
  void open_loop() {
    bool realtime = realtime_ && set_realtime(true);
    const size_t count = s_.rows.size();
    for (size_t k = 0; k < count; ++k) {
      // the first nanosecond at or after the intended time: sent_s >= intended_s whatever the rounding
      int64_t at = t0_ns_ + int64_t(std::ceil(s_.arrival_s[k] * 1e9));
      int64_t now = now_ns();
      if (now < at && realtime_ && !realtime) realtime = set_realtime(true);
      for (; now < at && !stopping_.load(); now = now_ns()) sleep_until_ns(std::min(at, now + kStopPollNs));
      if (realtime && now - at > kBehindNs) realtime = !set_realtime(false);
      if (stopping_.load()) return;
      if (s_.cap >= 0 && sent_.load() - finished_.load() >= s_.cap) {
        if (s_.drop) {
          out.put("D " + std::to_string(s_.rows[k]) + "\n");
          continue;
        }
        if (!wait_for_slot()) return;
      }
      send(s_.rows[k], s_.model[k], s_.payload[k]);
    }
  }

  bool wait_for_slot() {
    std::unique_lock<std::mutex> lock(slot_mu_);
    waiting_.store(true);
    while (sent_.load() - finished_.load() >= s_.cap && !stopping_.load())
      slot_cv_.wait_for(lock, std::chrono::nanoseconds(kStopPollNs));
    waiting_.store(false);
    return !stopping_.load();
  }

  void closed_loop() {
    end_ns_ = t0_ns_ + int64_t(s_.duration_s * 1e9);
    queues_.assign(s_.concurrency.size(), {});
    cursors_.assign(s_.concurrency.size(), 0);
    for (size_t k = 0; k < s_.rows.size(); ++k) {
      size_t m = size_t(s_.model[k]);
      if (m < queues_.size() && s_.concurrency[m] > 0) queues_[m].push_back(k);
    }
    for (size_t m = 0; m < queues_.size(); ++m)
      for (int32_t w = 0; w < s_.concurrency[m]; ++w) next(int32_t(m));
    while (!stopping_.load() && now_ns() < end_ns_ && !queues_empty()) sleep_until_ns(now_ns() + 5'000'000);
  }

  bool queues_empty() {
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (size_t m = 0; m < queues_.size(); ++m)
      if (cursors_[m] < queues_[m].size()) return false;
    return true;
  }

  void next(int32_t m) {  // closed loop: model m's next request, unless the run is over
    if (stopping_.load() || now_ns() >= end_ns_) return;
    size_t k;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (cursors_[size_t(m)] >= queues_[size_t(m)].size()) return;
      k = queues_[size_t(m)][cursors_[size_t(m)]++];
    }
    send(s_.rows[k], m, s_.payload[k]);
  }

  // Wait for in-flight requests (each bounded by its deadline); after a stop only grace_s; then cancel the rest.
  void drain() {
    bool stopped = stopping_.load();
    int64_t deadline = now_ns() + int64_t((stopped ? s_.grace_s : s_.timeout_s + 5.0) * 1e9);
    while (finished_.load() < sent_.load() && now_ns() < deadline && !cancel_at_once_.load()) {
      sleep_until_ns(now_ns() + kDrainPollNs);
      if (!stopped && stopping_.load()) {
        stopped = true;
        deadline = std::min(deadline, now_ns() + int64_t(s_.grace_s * 1e9));
      }
    }
    if (finished_.load() >= sent_.load()) return;
    calls_.cancel_live();
    int64_t until = now_ns() + kCancelWaitNs;
    while (finished_.load() < sent_.load() && now_ns() < until) sleep_until_ns(now_ns() + kDrainPollNs);
    if (!stopped) {  // requests outlived their own deadline: the transport is stuck
      std::lock_guard<std::mutex> lock(reason_mu_);
      if (reason_.empty()) reason_ = "requests outlived their deadline";
    }
  }

  void complete() {  // the completion thread: stamp each outcome the moment it comes out of the queue
    void* tag;
    bool ok;
    int64_t oks = 0;
    while (cq_.Next(&tag, &ok)) {
      Call* c = static_cast<Call*>(tag);
      int64_t row = c->row;
      arrays_.done[row] = since_t0(now_ns());
      if (c->status.ok()) {
        arrays_.status[row] = int8_t(s_.status_ok);
        ++oks;
      } else {
        arrays_.status[row] = int8_t(s_.status_error);  // the parent's judge refines it from the F message
        out.put_text("F " + std::to_string(row) + " " + std::to_string(int(c->status.error_code())) + " " +
                         std::to_string(oks),
                     c->status.error_message());
        oks = 0;
      }
      int32_t model = c->model;
      calls_.give_back(c);
      if (s_.mode == "closed") next(model);  // before counting this one: in flight never reads 0 between the two
      finished_.fetch_add(1);
      if (waiting_.load()) {
        std::lock_guard<std::mutex> lock(slot_mu_);
        slot_cv_.notify_one();
      }
    }
  }

  Share& s_;
  const bool realtime_;  // the timing and completion threads run at realtime priority (when permitted)
  Arrays arrays_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::CompletionQueue cq_;
  std::chrono::microseconds timeout_{0};
  Calls calls_;
  int64_t t0_ns_ = 0, end_ns_ = INT64_MAX;
  std::atomic<int64_t> sent_{0}, finished_{0};
  std::atomic<bool> stopping_{false}, cancel_at_once_{false}, waiting_{false};
  std::mutex slot_mu_, reason_mu_, queue_mu_;
  std::condition_variable slot_cv_;
  std::string reason_;
  std::vector<std::vector<size_t>> queues_;  // closed loop: per model, positions in the share
  std::vector<size_t> cursors_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--protocol") {  // the protocol, and whether realtime priority is permitted
    std::printf("%d %s\n", kProtocol, set_realtime(true) ? "realtime" : "normal");
    return 0;
  }
  signal(SIGINT, SIG_IGN);  // the parent handles Ctrl-C and SIGTERM and says "stop"
  signal(SIGTERM, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);  // a parent gone is seen as EOF / EPIPE, not a death by signal
  prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);  // wake within ~1 us of the deadline (default slack: 50 us)

  grpc_init();
  if (grpc_core::Executor::SetThreadingAll) grpc_core::Executor::SetThreadingAll(false);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Share share = read_share();
  out.start();
  bool realtime = set_realtime(true) && set_realtime(false);  // permitted here? (the threads ask for it themselves)
  Sender sender(share, realtime);
  if (!sender.connect()) {
    out.finish();
    _exit(0);
  }
  out.put(realtime ? "R 1\n" : "R 0\n");

  std::string command = read_line();
  if (command.rfind("go ", 0) != 0) {  // "stop" or the parent gone before the start: nothing is sent
    out.put_text("E 0", "stopped before the start");
    out.finish();
    _exit(0);
  }
  int64_t t0_ns = int64_t(std::llround(std::stod(command.substr(3)) * 1e9));
  std::thread commands([&sender] {
    while (true) {
      std::string line = read_line();
      if (line == "stop") {
        sender.stop(false, "stopped");
      } else {  // "cancel", or end of file: the parent is gone
        sender.stop(true, "stopped");
        if (line != "cancel") return;
      }
    }
  });
  commands.detach();
  double cpu = sender.run(t0_ns);
  char head[64];
  std::snprintf(head, sizeof head, "E %.6f", cpu);
  out.put_text(head, sender.reason());
  out.finish();
  _exit(0);  // calls stuck in the transport must not hold the exit
}
