"""Argument checks and shape plans: every rule an op's arguments must follow, in one place.

Each function takes shapes (never data) and plain argument values, checks them with PyTorch's
rules and returns what the op needs (normalised arguments, output shape), or raises an
``AnyDeviceError`` naming the op's argument. ``Backend`` (contract.py) calls them before any
kernel runs; the nodes call nothing here twice: they map the argument an error names to their
own widget (see nodes/base/common.py, ``PackNode.ARGS``).

The rules live in one module per op family (args: single arguments, vocabularies and the size check;
elementwise; conv; norms: normalisations and losses; windows; movement; attention); this package
names them all, so ``from .plans import X`` reads the same wherever X lives.
"""
# flake8: noqa: F401
from .args import (
    UNARY_OPS, BINARY_OPS, REDUCE_OPS, ACTIVATIONS, LOSSES, PADDING_MODES, REDUCTIONS, is_scalar, _is_int,
    pair, _number, positive, _check_choice, known, check_size, _mem, planned, SPEC_OP, MAX_INT, MAX_FLOAT)
from .elementwise import (
    broadcast_shapes, pair_shapes, normalize_dims, reduce_dims, softmax_dim, MatmulPlan, matmul_plan,
    linear_shapes, UNARY_PARAMS, _check_unary_params)
from .conv import (
    conv_output_size, conv_transpose_output_size, ConvGeometry, conv2d_geometry, conv_transpose2d_geometry,
    same_pads, _check_pad_mode, pad_plan, check_groups, _conv_common, _check_bias, Conv2dPlan,
    ConvTranspose2dPlan, conv2d_plan, conv_transpose2d_plan, conv_image, CONV_INDEX_MAX, conv_reach,
    conv_transpose_reach)
from .norms import (
    correction_arg, norm_eps, _affine_shape, normalized_dims, group_norm_shape, check_reduction,
    loss_threshold, bce_range, ssim_args, ssim_shape, class_dim, index_targets, prob_targets,
    label_smoothing_arg, dropout_args, batch_norm_args)
from .windows import (
    INTERPOLATE_MODES, PoolPlan, _window_input, pool_output_size, pool2d_plan, divisor_arg, adaptive_plan,
    InterpolatePlan, interpolate_plan)
from .movement import (
    COMPARE_OPS, crop_check, _int_seq, view_shape, one_dim, permute_dims, expand_shape, _sliceable,
    narrow_args, slice_args, _tensor_list, cat_plan, stack_plan, split_sizes, chunk_sizes)
from .attention import (
    AttentionPlan, attention_plan)
