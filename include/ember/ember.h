// Everything a user of Ember needs: #include <ember/ember.h>
#pragma once
#include "core/allocator.h"
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
#include "autograd/gradcheck.h"
