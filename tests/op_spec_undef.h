/* Undefines the words of an op's test description (backend/ops.def's fourth
 * field: SHAPES, VARY, DRAW, TOL, ...), which tests/test_backend.c defines
 * once for each pass over the table. No include guard: it is included after
 * every pass. */
#undef SHAPES
#undef VARY
#undef FIX
#undef DRAW
#undef TOL
#undef GRAD
#undef WRT
#undef FD
#undef FD_UNROUNDED
#undef INPLACE
#undef ALIAS
#undef REFUSE
#undef INVARIANT
#undef CUSTOM
#undef EXTRA
#undef REQUIRE
#undef REF
