/* The macros that expand ops.def. Each expansion site defines A as
 * DLREC_OPS_TUPLE and DLREC_OP as what it makes of an op, includes
 * ops.def, and undefines both:
 *
 *   #define A DLREC_OPS_TUPLE
 *   #define DLREC_OP(name, cpu, args, test) ... DLREC_OPS_PARAMS(args) ...
 *   #include "backend/ops.def"
 *   #undef DLREC_OP
 *   #undef A
 *
 * An op's args is a parenthesized list of tuples (role, type, name, size);
 * DLREC_OPS_EACH(M, args) applies M to each (up to 24 arguments), so one
 * expansion of an op can use its arguments several ways (a thunk's
 * parameters and the call it makes). */
#ifndef DLREC_BACKEND_OPS_TABLE_H
#define DLREC_BACKEND_OPS_TABLE_H

#include "backend/ops.h"

#define DLREC_OPS_TUPLE(...) (__VA_ARGS__)
/* The arguments after the first: ", a, b" made "a, b" (written
 * DLREC_OPS_DROP1(DLREC_OPS_NAMES(args))). */
#define DLREC_OPS_DROP1(...) DLREC_OPS_DROP1_(__VA_ARGS__)
#define DLREC_OPS_DROP1_(first, ...) __VA_ARGS__
#define DLREC_OPS_UNPAREN(...) __VA_ARGS__

/* ", type name" for each argument: a parameter list after the backend's. */
#define DLREC_OPS_PARAMS(args) DLREC_OPS_EACH(DLREC_OPS_PARAM_, args)
#define DLREC_OPS_PARAM_(role, type, name, size) , type name
/* ", name" for each argument: the call that passes them on. */
#define DLREC_OPS_NAMES(args) DLREC_OPS_EACH(DLREC_OPS_NAME_, args)
#define DLREC_OPS_NAME_(role, type, name, size) , name
/* ", pointer" for each argument that is the backend's memory: the buffers,
 * and a table's rows. */
#define DLREC_OPS_BUFFERS(args) DLREC_OPS_EACH(DLREC_OPS_BUFFER_, args)
#define DLREC_OPS_BUFFER_(role, type, name, size) DLREC_OPS_BUFFER_##role(name)
#define DLREC_OPS_BUFFER_IN(name) , (const void *)(name)
#define DLREC_OPS_BUFFER_OUT(name) , (const void *)(name)
#define DLREC_OPS_BUFFER_ACC(name) , (const void *)(name)
#define DLREC_OPS_BUFFER_INOUT(name) , (const void *)(name)
#define DLREC_OPS_BUFFER_WS(name) , (const void *)(name)
#define DLREC_OPS_BUFFER_ACT(name) , (const void *)(name)
#define DLREC_OPS_BUFFER_TABLE(name) , dlrec_table_raw_const(name)
#define DLREC_OPS_BUFFER_DIM(name)
#define DLREC_OPS_BUFFER_VAL(name)
#define DLREC_OPS_BUFFER_HOST(name)
#define DLREC_OPS_BUFFER_OBJ(name)

/* M applied to each tuple of args, in order. */
#define DLREC_OPS_EACH(M, args) DLREC_OPS_EACH_(M, DLREC_OPS_UNPAREN args)
#define DLREC_OPS_EACH_(M, ...)                                                                                     \
  DLREC_OPS_PICK_(__VA_ARGS__, DLREC_OPS_E24, DLREC_OPS_E23, DLREC_OPS_E22, DLREC_OPS_E21, DLREC_OPS_E20,             \
                  DLREC_OPS_E19, DLREC_OPS_E18, DLREC_OPS_E17, DLREC_OPS_E16, DLREC_OPS_E15, DLREC_OPS_E14,           \
                  DLREC_OPS_E13, DLREC_OPS_E12, DLREC_OPS_E11, DLREC_OPS_E10, DLREC_OPS_E9, DLREC_OPS_E8,             \
                  DLREC_OPS_E7, DLREC_OPS_E6, DLREC_OPS_E5, DLREC_OPS_E4, DLREC_OPS_E3, DLREC_OPS_E2, DLREC_OPS_E1)   \
  (M, __VA_ARGS__)
#define DLREC_OPS_PICK_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20,   \
                        _21, _22, _23, _24, NAME, ...)                                                               \
  NAME
#define DLREC_OPS_E1(M, x) M x
#define DLREC_OPS_E2(M, x, ...) M x DLREC_OPS_E1(M, __VA_ARGS__)
#define DLREC_OPS_E3(M, x, ...) M x DLREC_OPS_E2(M, __VA_ARGS__)
#define DLREC_OPS_E4(M, x, ...) M x DLREC_OPS_E3(M, __VA_ARGS__)
#define DLREC_OPS_E5(M, x, ...) M x DLREC_OPS_E4(M, __VA_ARGS__)
#define DLREC_OPS_E6(M, x, ...) M x DLREC_OPS_E5(M, __VA_ARGS__)
#define DLREC_OPS_E7(M, x, ...) M x DLREC_OPS_E6(M, __VA_ARGS__)
#define DLREC_OPS_E8(M, x, ...) M x DLREC_OPS_E7(M, __VA_ARGS__)
#define DLREC_OPS_E9(M, x, ...) M x DLREC_OPS_E8(M, __VA_ARGS__)
#define DLREC_OPS_E10(M, x, ...) M x DLREC_OPS_E9(M, __VA_ARGS__)
#define DLREC_OPS_E11(M, x, ...) M x DLREC_OPS_E10(M, __VA_ARGS__)
#define DLREC_OPS_E12(M, x, ...) M x DLREC_OPS_E11(M, __VA_ARGS__)
#define DLREC_OPS_E13(M, x, ...) M x DLREC_OPS_E12(M, __VA_ARGS__)
#define DLREC_OPS_E14(M, x, ...) M x DLREC_OPS_E13(M, __VA_ARGS__)
#define DLREC_OPS_E15(M, x, ...) M x DLREC_OPS_E14(M, __VA_ARGS__)
#define DLREC_OPS_E16(M, x, ...) M x DLREC_OPS_E15(M, __VA_ARGS__)
#define DLREC_OPS_E17(M, x, ...) M x DLREC_OPS_E16(M, __VA_ARGS__)
#define DLREC_OPS_E18(M, x, ...) M x DLREC_OPS_E17(M, __VA_ARGS__)
#define DLREC_OPS_E19(M, x, ...) M x DLREC_OPS_E18(M, __VA_ARGS__)
#define DLREC_OPS_E20(M, x, ...) M x DLREC_OPS_E19(M, __VA_ARGS__)
#define DLREC_OPS_E21(M, x, ...) M x DLREC_OPS_E20(M, __VA_ARGS__)
#define DLREC_OPS_E22(M, x, ...) M x DLREC_OPS_E21(M, __VA_ARGS__)
#define DLREC_OPS_E23(M, x, ...) M x DLREC_OPS_E22(M, __VA_ARGS__)
#define DLREC_OPS_E24(M, x, ...) M x DLREC_OPS_E23(M, __VA_ARGS__)

#endif
