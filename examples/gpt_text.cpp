// A small GPT-2 trained from scratch on bytes of English text, with the Accelerator: the same
// binary runs on one process or on several under `ember launch`:
//
//   build/examples/gpt_text                                        # about 10 minutes of training
//   build/bin/ember launch --num_processes 2 build/examples/gpt_text
//   build/bin/ember launch --mixed_precision bf16 build/examples/gpt_text
//
// Data (data/causal_lm_dataset.h): training on WikiText-2's validation file and the Gutenberg
// books shipped in datasets/corpus, validation on WikiText-2's test file, byte-tokenized
// (vocabulary 257: the bytes and an end-of-text id between documents). Training runs for
// --minutes of wall time (or exactly --steps steps), then the model is scored on the whole
// validation stream (perplexity per byte token and bits per byte) and samples a few lines from
// fixed prompts. The run is logged under <project-dir>/gpt_text/: metrics.jsonl, TensorBoard
// events and report.html.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "data/byte_tokenizer.h"
#include "data/causal_lm_dataset.h"
#include "data/dataloader.h"
#include "nn/models/gpt2.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd_adam.h"
#include "tracking/progress.h"
#include <ember/accelerate.h>

using namespace ember;

namespace {

const char* const kProgram = "gpt_text";

struct Options {
  std::string data_dir = std::string(EMBER_SOURCE_DIR) + "/datasets";
  std::string project_dir = "runs";
  std::string save;        // a save_pretrained directory for the trained model ("" : none)
  double minutes = 10;     // training wall-time budget
  int64_t steps = 0;       // > 0: exactly this many optimizer steps, no time budget
  int64_t batch = 32;      // sequences per optimizer step, over all processes
  int64_t context = 128;   // tokens per sequence (the model's n_positions)
  // 128 wide rather than 256, at 2e-3 rather than GPT-2's 3e-4: ten minutes on two CPU cores
  // are a few million tokens, and a model of 0.8 M parameters that sees 4.3 M of them in the
  // budget scores better than one of 3.3 M that sees 1.6 M (validation perplexity 8.0 against
  // 10.0, measured). At 256 wide, 1e-3 beat 3e-4 and 3e-3 over 60 steps.
  int64_t n_embd = 128, n_layer = 4, n_head = 4;
  double dropout = 0.1;
  double lr = 2e-3;
  int64_t warmup = 30;     // steps of linear warm-up (with --steps N: at most N / 10)
  std::string schedule = "cosine";  // or "linear": the decay after warm-up
  double weight_decay = 0.1;
  double clip = 1.0;
  std::string mixed_precision;  // "no", "bf16", "fp16"; empty: what `ember launch` passes
  int64_t eval_batch = 64;
  int64_t eval_windows = -1;  // score only the first N validation windows (quick checks)
  int64_t sample_tokens = 120;
  double temperature = 0.8;
  int64_t top_k = 40;
  int64_t log_every = 10;
  uint64_t seed = 0;
  int threads = 0;
};

const char* const kUsage =
    "usage: gpt_text [--minutes M | --steps N] [--batch B] [--context L] [--n_embd D] [--n_layer N]\n"
    "                [--n_head H] [--dropout P] [--lr X] [--warmup N] [--schedule cosine|linear]\n"
    "                [--weight_decay X] [--clip X] [--mixed_precision no|bf16|fp16] [--eval_batch B]\n"
    "                [--eval_windows N] [--sample_tokens N] [--temperature T] [--top_k K] [--log_every N]\n"
    "                [--save DIR] [--data_dir D] [--project_dir D] [--seed S] [--threads T]\n"
    "Options may also be spelt with dashes (--n-embd). Trains for --minutes (default 10) of wall\n"
    "time or exactly --steps steps, then prints the validation perplexity and bits per byte on\n"
    "WikiText-2 test and samples from fixed prompts.\n";

// The whole of `v` as a T (an integer or a floating-point type); else an error naming the flag.
template <typename T>
T to_number(const std::string& flag, const std::string& v) {
  size_t used = 0;
  T x{};
  try {
    if constexpr (std::is_integral_v<T>) x = T(std::stoll(v, &used));
    else x = T(std::stod(v, &used));
  } catch (const std::exception&) {
    used = 0;
  }
  EMBER_CHECK(used == v.size() && !v.empty() && std::isfinite(double(x)), kProgram, ": ", flag, " needs ",
              std::is_integral_v<T> ? "an integer" : "a number", ", got '", v, "'");
  return x;
}
const auto to_int = to_number<int64_t>;
const auto to_double = to_number<double>;

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    }
    EMBER_CHECK(k.rfind("--", 0) == 0, kProgram, ": unexpected argument '", k, "' (see --help)");
    for (size_t c = 2; c < k.size(); ++c)
      if (k[c] == '-') k[c] = '_';
    EMBER_CHECK(i + 1 < argc, kProgram, ": ", k, " needs a value");
    const std::string v = argv[++i];
    if (k == "--data_dir") o.data_dir = v;
    else if (k == "--project_dir") o.project_dir = v;
    else if (k == "--save") o.save = v;
    else if (k == "--minutes") o.minutes = to_double(k, v);
    else if (k == "--steps") o.steps = to_int(k, v);
    else if (k == "--batch") o.batch = to_int(k, v);
    else if (k == "--context") o.context = to_int(k, v);
    else if (k == "--n_embd") o.n_embd = to_int(k, v);
    else if (k == "--n_layer") o.n_layer = to_int(k, v);
    else if (k == "--n_head") o.n_head = to_int(k, v);
    else if (k == "--dropout") o.dropout = to_double(k, v);
    else if (k == "--lr") o.lr = to_double(k, v);
    else if (k == "--warmup") o.warmup = to_int(k, v);
    else if (k == "--schedule") o.schedule = v;
    else if (k == "--weight_decay") o.weight_decay = to_double(k, v);
    else if (k == "--clip") o.clip = to_double(k, v);
    else if (k == "--mixed_precision") o.mixed_precision = v;
    else if (k == "--eval_batch") o.eval_batch = to_int(k, v);
    else if (k == "--eval_windows") o.eval_windows = to_int(k, v);
    else if (k == "--sample_tokens") o.sample_tokens = to_int(k, v);
    else if (k == "--temperature") o.temperature = to_double(k, v);
    else if (k == "--top_k") o.top_k = to_int(k, v);
    else if (k == "--log_every") o.log_every = to_int(k, v);
    else if (k == "--seed") o.seed = uint64_t(to_int(k, v));
    else if (k == "--threads") o.threads = int(to_int(k, v));
    else EMBER_FAIL(kProgram, ": unknown option ", argv[i - 1], " (see --help)");
  }
  EMBER_CHECK(o.steps > 0 || o.minutes > 0, kProgram, ": --minutes must be positive, got ", o.minutes);
  EMBER_CHECK(o.steps >= 0, kProgram, ": --steps must be positive (0: use --minutes), got ", o.steps);
  EMBER_CHECK(o.batch >= 1, kProgram, ": --batch must be at least 1, got ", o.batch);
  EMBER_CHECK(o.context >= 2, kProgram, ": --context must be at least 2, got ", o.context);
  EMBER_CHECK(o.lr > 0, kProgram, ": --lr must be positive, got ", o.lr);
  EMBER_CHECK(o.warmup >= 0, kProgram, ": --warmup must be at least 0, got ", o.warmup);
  EMBER_CHECK(o.schedule == "cosine" || o.schedule == "linear", kProgram,
              ": --schedule must be cosine or linear, got ", o.schedule);
  EMBER_CHECK(o.weight_decay >= 0, kProgram, ": --weight_decay must be at least 0, got ", o.weight_decay);
  EMBER_CHECK(o.clip > 0, kProgram, ": --clip must be positive, got ", o.clip);
  EMBER_CHECK(o.eval_batch >= 1, kProgram, ": --eval_batch must be at least 1, got ", o.eval_batch);
  EMBER_CHECK(o.eval_windows != 0, kProgram, ": --eval_windows must be positive (or -1: all), got 0");
  EMBER_CHECK(o.sample_tokens >= 0, kProgram, ": --sample_tokens must be at least 0, got ", o.sample_tokens);
  EMBER_CHECK(o.top_k >= 0, kProgram, ": --top_k must be at least 0 (0: no top-k), got ", o.top_k);
  EMBER_CHECK(o.log_every >= 1, kProgram, ": --log_every must be at least 1, got ", o.log_every);
  return o;
}

// GPT-2's architecture at the sizes asked for, on the byte vocabulary (end-of-text as BOS/EOS).
nn::GPT2Config model_config(const Options& o) {
  nn::GPT2Config c;
  c.vocab_size = data::ByteTokenizer::kVocabSize;
  c.n_positions = o.context;
  c.n_embd = o.n_embd;
  c.n_layer = o.n_layer;
  c.n_head = o.n_head;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = o.dropout;
  c.bos_token_id = c.eos_token_id = data::ByteTokenizer::kEndOfTextId;
  c.validate();
  return c;
}

// Weight decay on the matrices (and the tied embeddings) only, not on biases and LayerNorm
// gains, as GPT-2 training recipes do: decaying a gain towards 0 only fights the normalisation.
std::vector<optim::ParamGroup> parameter_groups(const nn::Module& model, double weight_decay) {
  optim::ParamGroup decayed{.params = {}, .options = {{"weight_decay", weight_decay}}};
  optim::ParamGroup kept{.params = {}, .options = {{"weight_decay", 0.0}}};
  for (const auto& [name, p] : model.named_parameters()) (p.dim() >= 2 ? decayed : kept).params.push_back(p);
  return {decayed, kept};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// How many optimizer steps the run takes. With --steps, that many. With a time budget, the
// steps that fit in it: after every step, process 0 divides the time left by its mean step time
// so far and tells every process the plan and whether to stop, so that all stop at the same step
// (none waits for a peer that has left) and all follow the same learning-rate schedule.
class StepPlan {
 public:
  StepPlan(const Options& o, const Accelerator& acc) : acc_(acc), fixed_(o.steps > 0), budget_s_(o.minutes * 60) {
    total_ = fixed_ ? o.steps : o.warmup + 1;  // a time budget's horizon is known after the first step
  }
  void start() { t0_ = std::chrono::steady_clock::now(); }
  // Called by every process after step `step` (counted from 1); true when training is over.
  bool after_step(int64_t step) {
    if (fixed_) return step >= total_;
    std::vector<int64_t> plan = {0, 0};
    if (acc_.is_main_process()) {
      const double elapsed = seconds_since(t0_);
      const double left = std::max(0.0, budget_s_ - elapsed);
      plan = {elapsed >= budget_s_ ? 1 : 0, step + int64_t(left / (elapsed / double(step)))};
    }
    plan = acc_.broadcast(from_vector(plan, {2})).to_vector<int64_t>();
    total_ = plan[1];
    return plan[0] != 0 || step >= total_;
  }
  int64_t total() const { return total_; }
  double elapsed_seconds() const { return seconds_since(t0_); }

 private:
  const Accelerator& acc_;
  bool fixed_;
  double budget_s_;
  int64_t total_;
  std::chrono::steady_clock::time_point t0_;
};

// The validation stream scored: summed loss (nats), predicted tokens, and the bytes among them.
struct Score {
  double nats = 0;
  int64_t targets = 0, bytes = 0;
  double perplexity() const { return std::exp(nats / double(targets)); }
  // The end-of-text predictions' bits are counted too: they are part of coding the text.
  double bits_per_byte() const { return nats / std::log(2.0) / double(bytes); }
};

// Per-window sums over the validation loader, gathered across processes (each window once).
Score evaluate(Accelerator& acc, const PreparedModel<nn::GPT2LMHeadModel>& m, AcceleratedDataLoader& loader) {
  NoGradGuard no_grad;
  m->eval();
  Score score;
  ProgressBar bar("validation", loader.size(), "batch");
  int64_t done = 0;
  for (auto& batch : loader) {
    const Tensor& ids = batch.at("input_ids");
    const int64_t b = ids.size(0), len = ids.size(1);
    const Tensor logits = m->forward(ids).logits;
    // Position t predicts token t + 1, as the model's own loss shifts them.
    const Tensor targets = batch.at("labels").narrow(1, 1, len - 1);
    const Tensor nats = cross_entropy(logits.narrow(1, 0, len - 1).reshape({-1, logits.size(2)}),
                                      targets.reshape({-1}), -100, 0.0, Reduction::None)
                            .to(DType::f64)
                            .reshape({b, len - 1});
    const Tensor counted = ne(targets, -100.0);
    const Tensor is_byte = mul(counted, lt(targets, double(data::ByteTokenizer::kEndOfTextId)));
    auto [window_nats, window_targets, window_bytes] = acc.gather_for_metrics(std::make_tuple(
        sum(nats, {1}), sum(counted.to(DType::i64), {1}), sum(is_byte.to(DType::i64), {1})));
    score.nats += sum(window_nats).item<double>();
    score.targets += sum(window_targets).item<int64_t>();
    score.bytes += sum(window_bytes).item<int64_t>();
    char post[48];
    std::snprintf(post, sizeof post, "perplexity %.3f", score.perplexity());
    bar.update(++done, post);
  }
  bar.finish();
  m->train();
  return score;
}

// Writes newlines and tabs visibly, so each sample stays on one line.
std::string one_line(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options opt = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (opt.threads > 0) set_num_threads(opt.threads);
  manual_seed(opt.seed);
  AcceleratorOptions acc_options{.split_batches = true, .log_with = {"all"}, .project_dir = opt.project_dir};  // +
  if (!opt.mixed_precision.empty()) acc_options.mixed_precision = opt.mixed_precision;                       // +
  Accelerator acc(acc_options);                                                                              // +
  EMBER_CHECK(opt.batch % acc.num_processes() == 0, kProgram, ": --batch ", opt.batch, " must be a multiple of the ",
              acc.num_processes(), " processes (each takes an equal share of every batch)");
  EMBER_CHECK(opt.eval_batch % acc.num_processes() == 0, kProgram, ": --eval_batch ", opt.eval_batch,
              " must be a multiple of the ", acc.num_processes(), " processes");

  // ---- data
  const data::ByteTokenizer tok;
  const data::CausalLMFiles files = data::shipped_corpus_split(opt.data_dir);
  auto train_set = data::CausalLMDataset::from_files(tok, files.train, opt.context);
  auto eval_set = data::CausalLMDataset::from_files(tok, files.validation, opt.context, /*keep_tail=*/true);
  std::shared_ptr<const data::Dataset> eval_windows = eval_set;
  if (opt.eval_windows > 0 && opt.eval_windows < eval_set->size()) {
    std::vector<int64_t> first(static_cast<size_t>(opt.eval_windows));
    for (int64_t i = 0; i < opt.eval_windows; ++i) first[size_t(i)] = i;
    eval_windows = std::make_shared<data::Subset>(eval_set, first);
  }
  acc.print("gpt_text: training on", train_set->ids().size(), "byte tokens (", train_set->size(), "windows of",
            opt.context, "), validating on", eval_set->ids().size(), "(", eval_windows->size(), "windows )");
  data::DataLoader train_loader(train_set, {.batch_size = opt.batch, .shuffle = true, .drop_last = true});
  data::DataLoader eval_loader(eval_windows, {.batch_size = opt.eval_batch});
  EMBER_CHECK(train_loader.size() > 0, kProgram, ": --batch ", opt.batch, " is more than the ", train_set->size(),
              " training windows");

  // ---- model, optimizer, schedule
  const nn::GPT2Config config = model_config(opt);
  auto model = std::make_shared<nn::GPT2LMHeadModel>(config);
  auto optimizer = std::make_shared<optim::AdamW>(
      parameter_groups(*model, opt.weight_decay), optim::AdamWOptions{.lr = opt.lr, .weight_decay = opt.weight_decay});
  // get_scheduler's warm-up and decay, over a horizon that a time budget only knows once steps
  // have been timed: the plan sets it (identically on every process).
  StepPlan plan(opt, acc);
  const int64_t warmup = opt.steps > 0 ? std::min(opt.warmup, opt.steps / 10) : opt.warmup;
  const bool cosine = opt.schedule == "cosine";
  auto scheduler = std::make_shared<optim::LRScheduler>(*optimizer, [&plan, warmup, cosine](int64_t step) {
    return cosine ? optim::cosine_warmup_decay(step, warmup, plan.total())
                  : optim::linear_warmup_decay(step, warmup, plan.total());
  });
  auto [m, o, train, eval, s] = acc.prepare(model, optimizer, train_loader, eval_loader, scheduler);  // +
  acc.init_trackers(kProgram, {{"n_embd", opt.n_embd}, {"n_layer", opt.n_layer}, {"n_head", opt.n_head},  // +
                               {"context", opt.context}, {"batch", opt.batch}, {"lr", opt.lr},            // +
                               {"warmup", warmup}, {"schedule", opt.schedule}, {"minutes", opt.minutes},  // +
                               {"steps", opt.steps}, {"processes", acc.num_processes()},                  // +
                               {"mixed_precision", acc.mixed_precision()},                                 // +
                               {"parameters", config.parameter_count()}});                                 // +
  acc.print("gpt_text: GPT-2", opt.n_layer, "layers x", opt.n_embd, "wide,", opt.n_head, "heads,",
            int64_t(config.parameter_count()), "parameters;", acc.num_processes(), "process(es),", get_num_threads(),
            "thread(s) each, mixed precision", acc.mixed_precision());

  // ---- training
  m->train();
  const int64_t tokens_per_step = opt.batch * opt.context;
  ProgressBar bar("train", opt.steps, "step");
  plan.start();
  int64_t step = 0, epoch = 0;
  double last_log_s = 0, loss_ema = 0;
  int64_t last_log_step = 0;
  for (bool done = false; !done; ++epoch) {
    train->set_epoch(epoch);
    for (auto& batch : *train) {
      auto out = m->forward(batch.at("input_ids"), Tensor(), batch.at("labels"));
      acc.backward(out.loss);                          // +
      acc.clip_grad_norm_(m->parameters(), opt.clip);  // +
      o->step();
      s->step();
      o->zero_grad();
      ++step;
      done = plan.after_step(step);
      const double loss = out.loss.item<double>();
      loss_ema = step == 1 ? loss : 0.95 * loss_ema + 0.05 * loss;
      const double elapsed = plan.elapsed_seconds();
      char post[96];
      std::snprintf(post, sizeof post, "loss %.3f | %.0f tok/s | plan %lld steps", loss_ema,
                    double(step * tokens_per_step) / elapsed, (long long)plan.total());
      bar.update(step, post);
      if (step % opt.log_every == 0 || done) {
        const double mean_loss = acc.reduce(out.loss.detach(), "mean").item<double>();  // +
        const double tokens_per_s = double((step - last_log_step) * tokens_per_step) / (elapsed - last_log_s);
        acc.log({{"loss", mean_loss}, {"lr", s->get_last_lr()[0]}, {"tokens_per_s", tokens_per_s}}, step);  // +
        last_log_s = elapsed;
        last_log_step = step;
      }
      if (done) break;
    }
  }
  bar.finish();
  const double train_s = plan.elapsed_seconds();
  acc.print("gpt_text: trained", step, "steps (", step * tokens_per_step, "tokens,", epoch, "epoch(s) begun ) in",
            std::lround(train_s), "s:", std::lround(double(step * tokens_per_step) / train_s), "tokens/s");

  // ---- validation
  const Score score = evaluate(acc, m, *eval);
  char line[200];
  std::snprintf(line, sizeof line, "gpt_text: validation perplexity %.3f, %.4f bits per byte (%lld tokens predicted)",
                score.perplexity(), score.bits_per_byte(), (long long)score.targets);
  acc.print(line);
  acc.log({{"val_perplexity", score.perplexity()}, {"val_bits_per_byte", score.bits_per_byte()}}, step);  // +

  // ---- samples
  if (acc.is_main_process() && opt.sample_tokens > 0) {
    Generator generator(opt.seed);
    for (const std::string prompt : {"The ", "In 1914 ", "She said ", "It was a "}) {
      const std::vector<int64_t> ids = tok.encode(prompt);
      const Tensor out = m->generate(from_vector(ids, {1, int64_t(ids.size())}),
                                     {.max_new_tokens = opt.sample_tokens, .temperature = opt.temperature,
                                      .top_k = opt.top_k, .generator = &generator});
      std::printf("sample: %s\n", one_line(tok.decode(out.reshape({-1}).to_vector<int64_t>())).c_str());
    }
  }
  if (!opt.save.empty()) {
    acc.save_model(m, opt.save);  // + config.json and model.safetensors (from_pretrained reads them)
    acc.print("gpt_text: saved to", opt.save);
  }
  std::snprintf(line, sizeof line,
                "gpt_text: done: %lld steps in %.1f min on %d process(es), validation perplexity %.3f, %.4f bits per byte",
                (long long)step, train_s / 60, acc.num_processes(), score.perplexity(), score.bits_per_byte());
  acc.print(line);
  acc.end_training();  // + (also writes <project_dir>/gpt_text/report.html)
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
