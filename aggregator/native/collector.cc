// veil.aggregator._native_collector: the Collector service's gRPC listener in C++, handing the
// calls it gathers to one Python callable in sets (docs/design.md, "The native collector").
//
// Why: grpcio's sync server costs some 200 us of CPU per call before any handler runs, most of
// it handing each call to a Python thread and taking the GIL several times (bench/PROFILES.md
// section 4); gRPC's C++ callback server costs some 40 us. Here gRPC's own threads read each
// call and queue it; one Python thread (serve) takes every queued call, up to `most`, calls the
// handler once with the list, and answers each call from the list it returns. The GIL is taken
// once per set, and the store sees the set as one group write. Each call passes twice: first
// unread, with its metadata, for the checks that come before reading (its token and upload
// rate: a call refused there is answered unread, so a tokenless flood costs no memory for its
// messages, as on grpcio's listener), then, admitted and read, with its message.
//
// What Python decides stays in Python (veil.aggregator._native): which methods are served,
// tokens, rate limits, validation, statuses and messages. This file only moves bytes, bounds
// the memory of calls in flight as grpcio's listener does (each reserves the largest request's
// size of max_inflight_bytes before its message is read, waiting its turn up to a limit, then
// keeps its own size until answered), and serves TLS from the files it is given (gRPC's file
// watcher reads them again when they change).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr const char* kRetryAfterKey = "retry-after-ms";
constexpr auto kSweepEvery = std::chrono::milliseconds(100);  // how often waiting calls are looked at

struct Listener;

// One call: read its one request, queue it, answer it when the Python side has.
class Call final : public grpc::ServerGenericBidiReactor {
 public:
  Call(Listener* listener, grpc::GenericCallbackServerContext* context);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool) override {}
  void OnCancel() override { cancelled.store(true); }
  void OnDone() override;
  void Read() { StartRead(&request_); }
  void Admit(const std::string& name);
  void Answer(int code, const std::string& message, const std::string& body, long retry_after_ms);

  int method = -1;  // its index in the listener's methods
  bool read = false;  // false until its message is read: the first pass is its metadata's
  std::string token;  // the name of the token the first pass admitted it as
  std::string body;
  std::vector<std::string> authorization;
  std::atomic<bool> cancelled{false};
  int64_t reserved = 0;  // bytes of the in-flight budget this call holds (under the listener's mu)
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();

 private:
  Listener* listener_;
  grpc::GenericCallbackServerContext* context_;
  grpc::ByteBuffer request_, response_;
};

class Service final : public grpc::CallbackGenericService {
 public:
  explicit Service(Listener* listener) : listener_(listener) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override {
    return new Call(listener_, context);
  }

 private:
  Listener* listener_;
};

struct Listener {
  std::vector<std::string> methods;  // full names, e.g. /veil.wire.v1.Collector/Upload
  std::string unimplemented;         // the message for any other method
  int64_t max_message = 0;           // the largest request, reserved per call until it is read
  int64_t budget = 0;                // the in-flight bytes budget
  std::chrono::milliseconds budget_wait{0};  // how long a call may wait for its reservation
  long budget_retry_ms = 0;                  // the hint of a call that waited in vain
  std::string budget_refusal;                // and its message
  std::mutex mu;  // guards what follows
  std::condition_variable cv;        // serve(): a call was queued, or the listener stopped
  std::condition_variable sweep_cv;  // the sweeper: the listener is stopping or stopped
  int64_t held = 0;
  std::deque<Call*> waiting;  // calls waiting for their reservation, oldest first
  std::deque<Call*> unread;   // calls not yet read, for the Python side's first pass
  std::deque<Call*> inbox;    // calls read, for its second
  bool stopping = false;      // stop() has begun: waiting calls are refused
  bool stopped = false;       // Shutdown has returned: no call will be queued again
  Service service{this};
  std::unique_ptr<grpc::Server> server;
  std::thread sweeper;  // runs SweepLoop from start until stop
  int port = 0;

  // Reserve for the oldest waiting calls while the budget allows (mu held); they go to `start`.
  void AdmitLocked(std::vector<Call*>& start) {
    while (!waiting.empty() && !stopping && held + max_message <= budget) {
      Call* call = waiting.front();
      waiting.pop_front();
      held += max_message;
      call->reserved = max_message;
      start.push_back(call);
    }
  }

  // Give back `bytes` of a call's reservation; the calls it lets in start reading.
  void Release(Call* call, int64_t bytes) {
    std::vector<Call*> start;
    {
      std::lock_guard<std::mutex> lock(mu);
      call->reserved -= bytes;
      held -= bytes;
      AdmitLocked(start);
    }
    for (Call* c : start) c->Read();
  }

  // Every kSweepEvery until stopped, Sweep: a thread of its own, so that a wait ends on time
  // even while the Python side is busy with a slow store.
  void SweepLoop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        sweep_cv.wait_for(lock, kSweepEvery);
        if (stopped && waiting.empty()) return;
      }
      Sweep();
    }
  }

  // Answer the waiting calls that cannot wait longer: their caller left, their time is up, or
  // the listener is stopping.
  void Sweep() {
    std::vector<std::pair<Call*, grpc::StatusCode>> ended;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto now = std::chrono::steady_clock::now();
      for (auto it = waiting.begin(); it != waiting.end();) {
        Call* call = *it;
        grpc::StatusCode code = call->cancelled.load()          ? grpc::StatusCode::CANCELLED
                                : stopping                      ? grpc::StatusCode::UNAVAILABLE
                                : now - call->arrived >= budget_wait ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                                                : grpc::StatusCode::OK;
        if (code == grpc::StatusCode::OK) {
          ++it;
          continue;
        }
        ended.emplace_back(call, code);
        it = waiting.erase(it);
      }
    }
    for (auto& [call, code] : ended) {
      if (code == grpc::StatusCode::RESOURCE_EXHAUSTED)
        call->Answer(static_cast<int>(code), budget_refusal, "", budget_retry_ms);
      else if (code == grpc::StatusCode::UNAVAILABLE)
        call->Answer(static_cast<int>(code), "The aggregator is stopping; retry (an upload with the same batch id). Nothing was counted.", "", 0);
      else
        call->Answer(static_cast<int>(code), "The call ended before it was read.", "", 0);
    }
  }
};

Call::Call(Listener* listener, grpc::GenericCallbackServerContext* context)
    : listener_(listener), context_(context) {
  for (size_t i = 0; i < listener->methods.size(); i++)
    if (context->method() == listener->methods[i]) method = static_cast<int>(i);
  if (method < 0) {
    Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, listener->unimplemented));
    return;
  }
  for (const auto& [key, value] : context->client_metadata())
    if (key == "authorization") authorization.emplace_back(value.data(), value.size());
  {
    std::lock_guard<std::mutex> lock(listener->mu);
    listener->unread.push_back(this);  // the Python side checks its metadata first
  }
  listener->cv.notify_all();
}

void Call::Admit(const std::string& name) {
  token = name;
  // Reserve the largest request before reading this one, so calls in flight never hold more
  // than the budget; without room, wait behind the calls already waiting (Sweep ends the wait).
  std::vector<Call*> start;
  {
    std::lock_guard<std::mutex> lock(listener_->mu);
    listener_->waiting.push_back(this);
    listener_->AdmitLocked(start);
  }
  for (Call* c : start) c->Read();
}

void Call::OnReadDone(bool ok) {
  if (!ok) {  // the client sent no message (or left): nothing to hand over
    Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "The call carried no request message."));
    return;
  }
  std::vector<grpc::Slice> slices;
  request_.Dump(&slices);
  for (auto& s : slices) body.append(reinterpret_cast<const char*>(s.begin()), s.size());
  request_.Clear();
  int64_t size = static_cast<int64_t>(body.size());
  if (size < reserved) listener_->Release(this, reserved - size);
  read = true;
  {
    std::lock_guard<std::mutex> lock(listener_->mu);
    listener_->inbox.push_back(this);
  }
  listener_->cv.notify_all();
}

void Call::Answer(int code, const std::string& message, const std::string& body, long retry_after_ms) {
  if (code == 0) {
    grpc::Slice slice(body);
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    return;
  }
  if (retry_after_ms > 0) context_->AddTrailingMetadata(kRetryAfterKey, std::to_string(retry_after_ms));
  Finish(grpc::Status(static_cast<grpc::StatusCode>(code), message));
}

void Call::OnDone() {
  listener_->Release(this, reserved);
  delete this;
}

Listener* listener_of(PyObject* capsule) {
  return static_cast<Listener*>(PyCapsule_GetPointer(capsule, "veil.native_listener"));
}

void free_listener(PyObject* capsule) {
  Listener* listener = listener_of(capsule);
  if (listener == nullptr) return;
  // A listener never stopped may still have calls in gRPC's hands, which point at it: it is
  // left to the process's exit rather than freed under them.
  if (listener->stopped) delete listener;
}

// start(address, methods, max_message_bytes, (max_inflight_bytes, wait_seconds, retry_after_ms,
//       refusal), reuse_port, tls) -> (listener, port)
// tls: None, or (cert_file, key_file, client_ca_file or None).
PyObject* start(PyObject*, PyObject* args) {
  const char* address;
  PyObject* methods;
  long long max_message, budget;
  double wait;
  long retry_ms;
  const char* refusal;
  int reuse_port;
  PyObject* tls;
  if (!PyArg_ParseTuple(args, "sO!L(Ldls)pO", &address, &PyTuple_Type, &methods, &max_message, &budget, &wait,
                        &retry_ms, &refusal, &reuse_port, &tls))
    return nullptr;
  if (max_message <= 0 || budget < max_message) {
    PyErr_SetString(PyExc_ValueError, "max_inflight_bytes must be at least max_message_bytes, which must be positive.");
    return nullptr;
  }
  auto listener = std::make_unique<Listener>();
  listener->max_message = max_message;
  listener->budget = budget;
  listener->budget_wait = std::chrono::milliseconds(static_cast<int64_t>(wait * 1000));
  listener->budget_retry_ms = retry_ms;
  listener->budget_refusal = refusal;
  listener->unimplemented = "This listener serves only";
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(methods); i++) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(methods, i));
    if (name == nullptr) return nullptr;
    listener->methods.emplace_back(name);
    listener->unimplemented += std::string(i ? ", " : " ") + name;
  }
  listener->unimplemented += "; the aggregator's main gRPC listener serves the rest.";

  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls != Py_None) {
    const char *cert, *key, *client_ca = nullptr;
    if (!PyArg_ParseTuple(tls, "ssz", &cert, &key, &client_ca)) return nullptr;
    // The files are read again when they change (checked every second), so a rotated
    // certificate is served without a restart, as on the other listeners.
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
        client_ca ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(key, cert, client_ca, 1)
                  : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(key, cert, 1);
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_identity_key_cert_pairs();
    if (client_ca) {
      options.watch_root_certs();
      options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    credentials = grpc::experimental::TlsServerCredentials(options);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, credentials, &listener->port);
  builder.RegisterCallbackGenericService(&listener->service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, reuse_port);
  // As on the main listener: a call's message waits in its HTTP/2 stream window until it is
  // read, and without the bandwidth probe the windows of calls not yet read stay small.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 100);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument("grpc.http2.lookahead_bytes", 64 << 10);
  Py_BEGIN_ALLOW_THREADS
  listener->server = builder.BuildAndStart();
  Py_END_ALLOW_THREADS
  if (!listener->server || listener->port == 0) {
    PyErr_Format(PyExc_OSError, "cannot listen on %s", address);
    return nullptr;
  }
  Listener* started = listener.get();
  started->sweeper = std::thread([started] { started->SweepLoop(); });
  int port = listener->port;
  PyObject* capsule = PyCapsule_New(listener.release(), "veil.native_listener", free_listener);
  if (capsule == nullptr) return nullptr;
  return Py_BuildValue("(Ni)", capsule, port);
}

// serve(listener, handler, most, read): until stop() has returned and every call of its queue is
// answered, take the queued calls (at most `most` at once) of one queue, the calls read (read
// True) or those not yet read, and call
//     handler([(read, method index, authorization values, token, still active, request bytes), ...])
//         -> [(status code, message, response bytes, retry-after ms), ...]
// A call not yet read (read False: no token, no bytes) is admitted by code 0, its response
// bytes naming its token, and is read (within the budget) and handed over again (read True,
// with that token and its bytes); a call read is answered with code 0's response. Any other
// code refuses the call with that status and message, and the retry-after-ms trailer when
// the tuple's last number is above 0. Two Python threads serve the two queues, so that calls
// are checked and admitted while the other thread waits for the store. A handler that raises, or answers otherwise, fails its
// set with INTERNAL (and the error is printed): the Python side answers every call itself.
PyObject* serve(PyObject*, PyObject* args) {
  PyObject* capsule;
  PyObject* handler;
  int most, read;
  if (!PyArg_ParseTuple(args, "OOip", &capsule, &handler, &most, &read)) return nullptr;
  Listener* listener = listener_of(capsule);
  if (listener == nullptr) return nullptr;
  if (most < 1) most = 1;
  std::vector<Call*> taken;
  struct Reply {
    int code;
    std::string message, body;
    long retry_after_ms;
  };
  std::vector<Reply> replies;
  std::deque<Call*>& queue = read ? listener->inbox : listener->unread;
  for (;;) {
    bool stopped;
    Py_BEGIN_ALLOW_THREADS
    {
      std::unique_lock<std::mutex> lock(listener->mu);
      listener->cv.wait(lock, [&] { return !queue.empty() || listener->stopped; });
      while (!queue.empty() && static_cast<int>(taken.size()) < most) {
        taken.push_back(queue.front());
        queue.pop_front();
      }
      stopped = listener->stopped;
    }
    Py_END_ALLOW_THREADS
    if (taken.empty()) {
      if (stopped) break;
      continue;
    }
    PyObject* calls = PyList_New(static_cast<Py_ssize_t>(taken.size()));
    if (calls == nullptr) return nullptr;
    for (size_t i = 0; i < taken.size(); i++) {
      Call* call = taken[i];
      PyObject* authorization = PyTuple_New(static_cast<Py_ssize_t>(call->authorization.size()));
      for (size_t j = 0; authorization && j < call->authorization.size(); j++)
        PyTuple_SET_ITEM(authorization, j,
                         PyUnicode_DecodeLatin1(call->authorization[j].data(), call->authorization[j].size(), nullptr));
      PyObject* item =
          Py_BuildValue("(OiNs#Oy#)", call->read ? Py_True : Py_False, call->method, authorization, call->token.data(),
                        static_cast<Py_ssize_t>(call->token.size()), call->cancelled.load() ? Py_False : Py_True,
                        call->body.data(), static_cast<Py_ssize_t>(call->body.size()));
      if (item == nullptr) {
        Py_DECREF(calls);
        return nullptr;
      }
      PyList_SET_ITEM(calls, i, item);
      std::string().swap(call->body);  // the bytes now live in Python's object
    }
    PyObject* out = PyObject_CallOneArg(handler, calls);
    Py_DECREF(calls);
    replies.clear();
    bool ok = out != nullptr && PyList_Check(out) && PyList_GET_SIZE(out) == static_cast<Py_ssize_t>(taken.size());
    for (size_t i = 0; ok && i < taken.size(); i++) {
      int code;
      const char *message, *body;
      Py_ssize_t message_size, body_size;
      long retry;
      PyObject* reply = PyList_GET_ITEM(out, i);
      ok = PyTuple_Check(reply) &&
           PyArg_ParseTuple(reply, "is#y#l", &code, &message, &message_size, &body, &body_size, &retry);
      if (ok) replies.push_back({code, std::string(message, message_size), std::string(body, body_size), retry});
    }
    if (!ok) {
      if (PyErr_Occurred()) PyErr_Print();
      replies.assign(taken.size(), {static_cast<int>(grpc::StatusCode::INTERNAL),
                                    "The aggregator failed on this call; retry it (a batch is counted at most once).",
                                    "", 0});
    }
    Py_XDECREF(out);
    Py_BEGIN_ALLOW_THREADS
    for (size_t i = 0; i < taken.size(); i++) {
      if (!taken[i]->read && replies[i].code == 0)
        taken[i]->Admit(replies[i].body);
      else
        taken[i]->Answer(replies[i].code, replies[i].message, replies[i].body, replies[i].retry_after_ms);
    }
    Py_END_ALLOW_THREADS
    taken.clear();
  }
  Py_RETURN_NONE;
}

// stop(listener, grace_seconds): refuse new calls and those still waiting for the budget, give
// those read the grace period to be answered (serve must be running to answer them), then cancel
// the rest; serve returns after.
PyObject* stop(PyObject*, PyObject* args) {
  PyObject* capsule;
  double grace;
  if (!PyArg_ParseTuple(args, "Od", &capsule, &grace)) return nullptr;
  Listener* listener = listener_of(capsule);
  if (listener == nullptr) return nullptr;
  if (listener->stopping) Py_RETURN_NONE;  // stopped, or being stopped, by an earlier call
  Py_BEGIN_ALLOW_THREADS
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(grace > 0 ? grace * 1000 : 0));
  {
    std::lock_guard<std::mutex> lock(listener->mu);
    listener->stopping = true;  // the sweeper refuses the waiting calls
  }
  listener->sweep_cv.notify_all();
  listener->server->Shutdown(deadline);
  {
    std::lock_guard<std::mutex> lock(listener->mu);
    listener->stopped = true;
  }
  listener->cv.notify_all();
  listener->sweep_cv.notify_all();
  listener->sweeper.join();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"start", start, METH_VARARGS, "start(address, methods, max_message_bytes, max_inflight_bytes, reuse_port, tls)"},
    {"serve", serve, METH_VARARGS, "serve(listener, handler, most, read)"},
    {"stop", stop, METH_VARARGS, "stop(listener, grace_seconds)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_native_collector",
                       "The Collector's gRPC listener in C++ (see veil.aggregator._native).", -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__native_collector() { return PyModule_Create(&kModule); }
