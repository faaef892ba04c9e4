// Everything a user of Ember needs: #include <ember/ember.h>
#pragma once

// core: tensors, ops, devices, threads, random numbers
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/batch.h"
#include "core/device_api.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"

// autograd
#include "autograd/checkpoint.h"
#include "autograd/gradcheck.h"

// nn: modules, layers, BERT, Hugging Face formats
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/io/json_config.h"
#include "nn/io/safetensors.h"
#include "nn/layers/attention.h"
#include "nn/layers/basic.h"
#include "nn/layers/containers.h"
#include "nn/layers/conv.h"
#include "nn/layers/normalization.h"
#include "nn/layers/pooling.h"
#include "nn/losses.h"
#include "nn/models/bert.h"
#include "nn/models/gpt2.h"
#include "nn/models/pretrained.h"
#include "nn/models/resnet.h"
#include "nn/module.h"

// optim
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/sgd_adam.h"

// data
#include "data/collate.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/idx_file.h"
#include "data/image_datasets.h"
#include "data/mlm_collator.h"
#include "data/sampler.h"
#include "data/text_datasets.h"
#include "data/tsv_dataset.h"
#include "data/wordpiece_tokenizer.h"

// Tracking: metrics to JSONL and TensorBoard, the run report, progress bars
#include "tracking/plot/html_report.h"
#include "tracking/progress.h"
#include "tracking/tracker_group.h"
