// SGD (momentum, Nesterov, weight decay), Adam and AdamW (decoupled weight decay), each a
// single fused pass per parameter.
#pragma once
#include "optim/optimizer.h"

namespace ember::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& params, SGDOptions opt) : SGD(single_group(params), opt) {}
  SGD(std::vector<ParamGroup> groups, SGDOptions opt);
  void step() override;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // A parameter whose whole gradient is row-sparse (core/sparse_grad.h: an Embedding(sparse)
  // not tied to a dense use) updates only the rows it touched, as torch.optim.SparseAdam does:
  // the moments of the other rows do not decay and weight decay reaches touched rows only.
  // Off: the rows are added into a dense gradient and every row steps (the exact dense rule).
  bool lazy_sparse = false;
};

class Adam : public Optimizer {
 public:
  Adam(const std::vector<Tensor>& params, AdamOptions opt) : Adam(single_group(params), opt) {}
  Adam(std::vector<ParamGroup> groups, AdamOptions opt, bool decoupled = false);
  void step() override;
  // Multiplies every gradient by this before the update (used to unscale fp16 gradients in the
  // same pass). Reset to 1 after each step.
  void set_grad_scale(double s) { grad_scale_ = s; }

 private:
  bool decoupled_;
  bool lazy_sparse_ = false;
  double grad_scale_ = 1.0;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool lazy_sparse = false;  // as AdamOptions::lazy_sparse
};

class AdamW : public Adam {
 public:
  AdamW(const std::vector<Tensor>& params, AdamWOptions opt) : AdamW(single_group(params), opt) {}
  AdamW(std::vector<ParamGroup> groups, AdamWOptions opt);
};

}  // namespace ember::optim
